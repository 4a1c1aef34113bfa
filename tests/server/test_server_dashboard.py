"""The dashboard's data: its self-contained page and scripts, the history ring, conversations
per client (sessions, openings, cache hits, tool calls, guard events) and the team board."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from locals.server.activity import Activity
from locals.server.history import HISTORY, History
from locals.server.state import ServerState
from locals.server.team import STALE_S, TeamBoard, parse_report
from locals.errors import RequestError

from tests.helpers.server_fakes import ScriptedEngine, make_state, start_client

TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
CALL = '<tool_call>{"name": "read_file", "arguments": {"path": "a.py"}}</tool_call>'


def chat(first: str, *later: str) -> dict:
    """A conversation opening with `first`; later user turns repeat the opening, as agents do."""
    messages = [{"role": "system", "content": "you are a coder"}, {"role": "user", "content": first}]
    for text in later:
        messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": text}]
    return {"model": "m", "messages": messages}


def looping(repeats: int) -> dict:
    messages = [{"role": "user", "content": "fix the bug"}]
    for i in range(repeats):
        messages += [{"role": "assistant", "content": None, "tool_calls": [{"id": f"c{i}", "type": "function",
                      "function": {"name": "read_file", "arguments": json.dumps({"path": "a.py"})}}]},
                     {"role": "tool", "tool_call_id": f"c{i}", "content": "print(1)"}]
    return {"model": "m", "messages": messages, "tools": TOOLS}


async def test_page_and_scripts_are_served_here_and_fetch_nothing_elsewhere():
    client = await start_client(make_state(ScriptedEngine(), api_key="k"))
    try:
        texts = {}
        for path, kind in [("/dashboard", "text/html"), ("/static/dashboard.js", "text/javascript"),
                           ("/static/charts.js", "text/javascript"), ("/static/dashboard.css", "text/css")]:
            resp = await client.get(path)  # no key: monitoring is open
            assert resp.status == 200 and resp.content_type == kind, path
            texts[path] = await resp.text()
        for path, text in texts.items():  # no CDN, no remote font: it must work offline
            assert not re.search(r"""(src|href)=["']?(https?:)?//|@import|url\(\s*["']?https?:|https?://(?!www\.w3\.org/2000/svg)""",
                                 text), path
        assert "drawChart" in texts["/static/charts.js"] and "/v1/locals/history" in texts["/static/dashboard.js"]
        for name in ("app.py", "dashboard.html.bak", "%2e%2e%2fapp.py"):  # only the page's own files
            assert (await client.get(f"/static/{name}", headers={"x-api-key": "k"})).status == 404, name
        for path in ("/v1/locals/history", "/v1/locals/conversations", "/v1/locals/team"):
            assert (await client.get(path)).status == 200, path
        report = await client.post("/v1/locals/team", json={"run": "r1", "state": "running"})
        assert report.status == 401  # writing is not monitoring: it needs the key
    finally:
        await client.close()


def test_the_ring_keeps_the_last_minutes_and_the_ttfts_of_each_interval():
    state = make_state(ScriptedEngine())
    ring = History(keep_s=5, interval_s=1)
    activity = state.backend.activity
    record = activity.begin("r1", "openai", 10)
    activity.first_token(record)
    first = ring.take(state, now=100.0)
    assert first.ttft_s is not None and first.decode_tps == 12.5 and first.in_flight == 1
    assert ring.take(state, now=101.0).ttft_s is None  # nothing started in that second
    for t in range(102, 110):
        ring.take(state, now=float(t))
    assert [s["t"] for s in ring.since(0)] == [105.0, 106.0, 107.0, 108.0, 109.0]
    assert [s["t"] for s in ring.since(107.0)] == [108.0, 109.0]
    assert History().take(ServerState(model="qwen")) is None  # loading: nothing to sample


async def test_history_endpoint_serves_the_sampler_and_refuses_a_bad_since():
    client = await start_client(make_state(ScriptedEngine()))
    try:
        ring = client.server.app[HISTORY]
        for _ in range(100):  # the sampler task runs from startup, once a second
            if ring.samples:
                break
            await asyncio.sleep(0.05)
        body = await (await client.get("/v1/locals/history")).json()
        assert body["interval_s"] == 1.0 and body["samples"][0]["decode_tps"] == 12.5
        later = await (await client.get(f"/v1/locals/history?since={body['samples'][-1]['t']}")).json()
        assert later["samples"] == [] or later["samples"][0]["t"] > body["samples"][-1]["t"]
        bad = await client.get("/v1/locals/history?since=yesterday")
        assert bad.status == 400 and "`since`" in (await bad.json())["error"]["message"]
    finally:
        await client.close()


async def test_conversations_are_told_apart_by_session_or_opening():
    engine = ScriptedEngine(replies=["a", "b", "c", "d", "e", CALL, "f", "g"], cached=3)
    client = await start_client(make_state(engine))
    try:
        agent = {"User-Agent": "opencode/0.9 ai-sdk/5"}
        await client.post("/v1/chat/completions", json=chat("fix a"), headers={**agent, "X-Session-Id": "s1"})
        await client.post("/v1/chat/completions", json=chat("other opening"), headers={**agent, "X-Session-Id": "s1"})
        await client.post("/v1/chat/completions", json=chat("task one"), headers={"User-Agent": "aider"})
        await client.post("/v1/chat/completions", json=chat("task one", "go on"), headers={"User-Agent": "aider"})
        await client.post("/v1/messages", json=chat("hello") | {"max_tokens": 9},
                          headers={"User-Agent": "claude-cli/1.0.83 (external, cli)",
                                   "X-Claude-Code-Session-Id": "cc-7"})
        await client.post("/v1/chat/completions", json=chat("tools please") | {"tools": TOOLS},
                          headers={"User-Agent": "codex_cli_rs/0.5", "session_id": "cx-1"})
        await client.post("/v1/responses", json={"model": "m", "input": "hi", "prompt_cache_key": "pck-1"},
                          headers={"User-Agent": "codex_exec/0.6"})
        await client.post("/v1/messages", json=chat("hey") | {"max_tokens": 9, "metadata": {"user_id": "u_42"}},
                          headers={"User-Agent": "claude-cli/1.0.83"})
        await client.post("/v1/chat/completions", json=looping(3), headers={"User-Agent": "cline"})
        await client.post("/v1/chat/completions", json=looping(5), headers={"User-Agent": "cline"})
        rows = (await (await client.get("/v1/locals/conversations")).json())["conversations"]
        by_key = {r["key"]: r for r in rows}
        session = by_key["opencode/0.9|session:s1"]
        assert session["requests"] == 2 and session["title"] == "fix a" and session["in_flight"] == 0
        assert session["cached_tokens"] == 6 and 0 < session["cache_hit"] < 1
        aider = [r for r in rows if r["client"] == "aider"]
        assert len(aider) == 1 and aider[0]["requests"] == 2 and aider[0]["session"] is None
        assert by_key["claude-cli/1.0.83|session:cc-7"]["requests"] == 1
        assert by_key["codex_cli_rs/0.5|session:cx-1"]["tool_calls"] == 1
        assert by_key["codex_exec/0.6|session:pck-1"]["title"] == "hi"  # named in the body instead
        assert by_key["claude-cli/1.0.83|session:u_42"]["requests"] == 1
        cline = [r for r in rows if r["client"] == "cline"]
        assert len(cline) == 1 and cline[0]["guards"] == {"tool_loop_steered": 1, "tool_loop": 1}
        assert rows[0]["client"] == "cline"  # the most recently seen first
        status = await (await client.get("/v1/locals/status")).json()
        assert status["requests"]["recent"][0]["guards"] == ["tool_loop"]
        assert status["requests"]["recent"][-1]["client"] == "opencode/0.9"
    finally:
        await client.close()


def test_the_conversation_book_keeps_the_most_recent():
    activity = Activity()
    activity.conversations.keep = 3
    for i in range(5):
        activity.end(activity.begin(f"r{i}", "openai", 1, conversation=f"c{i}"), "stop", 1, 0)
    assert [r["key"] for r in activity.conversations.rows()] == ["c4", "c3", "c2"]


REPORT = {"run": "ab12", "state": "running", "task": "add a test", "directory": "/p", "check": "pytest -q",
          "mode": "change", "started": 1000, "max_steps": 6,
          "parts": [{"index": 0, "goal": "add a test", "status": "applied", "winner": 1, "files": ["t.py"],
                     "detail": "", "patch": "+x\n" * 20_000}],
          "agents": [{"part": 0, "agent": 1, "worktree": "p1-a2", "session": "ab12/p1-a2", "step": 3,
                      "action": "write_file t.py", "status": "passed", "check": "1 passed", "check_passed": True,
                      "tokens": 1234}]}


async def test_team_reports_are_shown_and_bad_ones_refused():
    client = await start_client(make_state(ScriptedEngine()))
    try:
        assert (await client.post("/v1/locals/team", json=REPORT)).status == 200
        runs = (await (await client.get("/v1/locals/team")).json())["runs"]
        assert runs[0]["run"] == "ab12" and runs[0]["active"] and runs[0]["agents"][0]["worktree"] == "p1-a2"
        assert len(runs[0]["parts"][0]["patch"]) == 20_000  # clipped
        for bad, says in [({"state": "running"}, "`run` is required"),
                          (REPORT | {"state": "dancing"}, "`state` must be one of"),
                          (REPORT | {"agents": [{"step": "three"}]}, "agents[0]: `step` must be an integer"),
                          (REPORT | {"parts": [{"files": [1]}]}, "parts[0]: `files` must be an array of strings"),
                          (REPORT | {"agents": ["x"]}, "`agents[0]` must be an object")]:
            resp = await client.post("/v1/locals/team", json=bad)
            assert resp.status == 400 and says in (await resp.json())["error"]["message"], bad
        resp = await client.post("/v1/locals/team", data=b"not json")
        assert resp.status == 400 and "not valid JSON" in (await resp.json())["error"]["message"]
    finally:
        await client.close()


def test_the_board_keeps_the_last_runs_and_lets_silent_ones_go():
    board = TeamBoard(keep=2)
    for i, state in enumerate(["running", "done", "running"]):
        board.report(parse_report(REPORT | {"run": f"r{i}", "state": state}), now=1000.0 + i)
    runs = board.runs(now=1003.0)
    assert [r["run"] for r in runs] == ["r2", "r1"] and [r["active"] for r in runs] == [True, False]
    assert not board.runs(now=1002.0 + STALE_S + 1)[0]["active"]  # no report for a minute: gone
    with pytest.raises(RequestError, match="1 to 64"):
        parse_report({"run": "x" * 65, "state": "running"})


def test_a_conversation_is_titled_by_what_the_user_wrote_not_by_its_tools_notes():
    from locals.server.callers import title_of

    claude_turn = [{"role": "user", "content": [
        {"type": "text", "text": "<system-reminder>\nAs you answer, use this context:\n# claudeMd\n</system-reminder>"},
        {"type": "text", "text": "fix the failing test"}]}]
    assert title_of(claude_turn, None) == "fix the failing test"
    only_notes = [{"role": "user", "content": "<system-reminder>x</system-reminder>"}]
    assert title_of(only_notes, None) == "<system-reminder>x</system-reminder>"  # better than no title
