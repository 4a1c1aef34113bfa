"""The runner's progress reports: a run against a scripted endpoint shows up on a locals
server's team board (agents, worktrees, steps, checks, the applied patch), and a server
without a board, or none at all, changes nothing about the run."""

from __future__ import annotations

import socket

from agents.events import AgentStarted, AgentStep, fan_out
from agents.report import TeamReporter
from agents.runner import RunOptions, run_team
from locals.client import ChatClient

from tests.helpers.fake_openai import FakeOpenAI
from tests.helpers.runner_project import CHECK, TASK, coder, make_project
from tests.helpers.server_fakes import ScriptedEngine, make_state, start_client


def options(project) -> RunOptions:
    return RunOptions(task=TASK, directory=project, check=CHECK, agents=2, max_steps=6, timeout_s=120, sandbox=False)


async def test_a_run_reports_its_team_to_the_locals_board(tmp_path):
    board = await start_client(make_state(ScriptedEngine()))
    fake = FakeOpenAI(coder(good_agents={1}))
    opts = options(make_project(tmp_path))
    events = []
    try:
        async with fake as url, ChatClient(url) as client, \
                TeamReporter(str(board.make_url("/")), opts) as reporter:
            report = await run_team(opts, client, fan_out(events.append, reporter))
            reporter.finish(report)
        assert report.ok and not reporter.off
        run = (await (await board.get("/v1/locals/team")).json())["runs"][0]
        assert run["run"] == opts.run_id and run["state"] == "done" and run["message"].startswith("applied")
        assert run["task"] == TASK and run["check"] == CHECK and not run["active"]
        part = run["parts"][0]
        assert part["status"] == "applied" and part["winner"] == 1 and "count_words" in part["patch"]
        agents = {a["agent"]: a for a in run["agents"]}
        assert agents[1]["worktree"] == "p1-a2" and agents[1]["session"] == f"{opts.run_id}/p1-a2"
        assert agents[1]["check_passed"] is True and agents[1]["status"] == "passed" and agents[1]["step"] >= 3
        assert agents[0]["worktree"] == "p1-a1" and agents[0]["status"] != "passed"  # lost (failed or stopped)
        started = [e for e in events if isinstance(e, AgentStarted)]
        assert [(e.agent, e.worktree) for e in started] == [(0, "p1-a1"), (1, "p1-a2")]
    finally:
        await board.close()


async def test_reports_to_a_server_without_a_board_stop_and_the_run_goes_on(tmp_path):
    fake = FakeOpenAI(coder(good_agents={0}))
    opts = options(make_project(tmp_path))
    async with fake as url, ChatClient(url) as client, TeamReporter(url, opts) as reporter:
        report = await run_team(opts, client, reporter)
        reporter.finish(report)
    assert report.ok and reporter.off  # the fake answers 404: no second try


async def test_a_server_that_is_gone_changes_nothing(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    opts = options(make_project(tmp_path))
    async with TeamReporter(f"http://127.0.0.1:{port}", opts) as reporter:
        reporter(AgentStarted(0, 0, "p1-a1", "s"))
        reporter(AgentStep(0, 0, 1, "list_files .", 10))
    assert reporter.state["state"] == "stopped" and reporter.state["agents"][0]["step"] == 1


async def test_each_agent_names_its_session_to_the_server():
    server = await start_client(make_state(ScriptedEngine()))
    try:
        async with ChatClient(str(server.make_url("/"))) as client:
            await client.chat([{"role": "user", "content": "hi"}], session="ab12/p1-a1")
        rows = (await (await server.get("/v1/locals/conversations")).json())["conversations"]
        assert rows[0]["client"].startswith("locals-run/") and rows[0]["session"] == "ab12/p1-a1"
    finally:
        await server.close()
