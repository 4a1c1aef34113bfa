"""The served-traffic benchmark without a model: the planned traffic, the report's arithmetic,
the streaming client, and whole runs against a stand-in server subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil

import pytest
from rich.console import Console

from locals.errors import LocalsError
from locals.traffic import servers as srv
from locals.traffic.driver import Reply, _read_chunk, next_messages
from locals.traffic.report import percentile, phase_figures, ratios, rounds_text, summarise, table
from locals.traffic.run import Plan, finish, merge, run
from locals.traffic.workload import WORDS, Workload, plan_agents

from tests.helpers.repo import REPO

FAKE = str(REPO / "tests" / "helpers" / "traffic_fake_server.py")


def fake_server(name: str, *options: str) -> srv.ServerSpec:
    return srv.ServerSpec(name, (sys.executable, FAKE, "{port}", *options), "/health")


def test_the_plan_is_the_seed_s_and_keeps_the_traffic_s_shape():
    w = Workload(turns=3, size_scale=0.5, time_scale=0.1)
    plans = plan_agents(4, w, seed=7, nonce="n0nce")
    assert plans == plan_agents(4, w, seed=7, nonce="n0nce")
    assert plans[0].turns != plan_agents(4, w, seed=8, nonce="n0nce")[0].turns
    assert len({p.system for p in plans}) == 1 and plans[0].system.startswith("Session n0nce.")
    assert 1000 <= len(plans[0].system.split()) - 14 <= 2000  # 2–4k words, halved
    assert [p.start_s for p in plans] == pytest.approx([0.0, 1 / 3, 2 / 3, 1.0])  # 10 s x 0.1
    assert [p.offers_tools for p in plans] == [True, False, True, False]
    for p in plans:
        assert len(p.turns) == 3 and p.turns[-1].tool_time_s == 0.0
        for t in p.turns:
            assert 25 <= t.max_tokens <= 200 and 0.0 <= t.tool_time_s <= 1.0
            assert 50 <= sum(word in WORDS for word in t.text.split()) <= 750
        assert p.burst.max_tokens == 128 and p.burst.tool_time_s == 0.0
    assert w.scaled().scaled() == w.scaled()  # scaling is applied once


def test_one_agent_starts_at_once_and_offers_tools():
    (only,) = plan_agents(1, Workload(), seed=0)
    assert only.start_s == 0.0 and only.offers_tools


def test_percentile_interpolates_between_ranks():
    values = list(range(1, 101))
    assert percentile(values, 0.5) == pytest.approx(50.5)
    assert percentile(values, 0.99) == pytest.approx(99.01)
    assert percentile([3.0], 0.99) == 3.0 and percentile([], 0.5) is None


def _reply(agent, turn, sent, first, ended, tokens, gaps=(), error=None):
    return Reply(agent, turn, sent=sent, first=first, ended=ended, gaps=list(gaps), completion_tokens=tokens,
                 error=error)


def test_phase_figures_follow_their_definitions():
    talks = [_reply(0, 0, 1.0, 1.5, 3.0, 20, [0.1, 0.2]), _reply(1, 0, 2.0, 2.1, 5.0, 40, [0.3]),
             _reply(0, 1, 4.0, None, 4.5, 0, error="HTTP 500")]
    burst = [_reply(0, -1, 10.0, 10.5, 12.0, 30, [0.05]), _reply(1, -1, 10.0, 11.0, 14.0, 50)]
    f = phase_figures({"agents": talks, "burst": burst})
    assert f["wait_s"] == pytest.approx(2.0 + 3.0 + 0.5)  # every conversation request, failed ones too
    assert f["output_tps"] == pytest.approx(60 / (5.0 - 1.0))
    assert f["burst_tps"] == pytest.approx(80 / (14.0 - 10.0))
    assert f["ttft_p50_s"] == pytest.approx(0.5)  # of 0.5, 0.1, 0.5, 1.0
    assert f["gap_max_ms"] == pytest.approx(300.0)
    assert f["gap_p99_ms"] == pytest.approx(percentile([0.1, 0.2, 0.3, 0.05], 0.99) * 1000)
    assert (f["requests"], f["failed"], f["output_tokens"]) == (5, 1, 140)


def _round(wait, tps, first=5.0, error=None):
    figures = {"wait_s": wait, "output_tps": tps, "burst_tps": tps, "ttft_p50_s": 0.1, "ttft_p99_s": 0.2,
               "gap_p99_ms": 10.0, "gap_max_ms": 20.0, "failed": 0}
    return {"ready_s": 1.0, "first_token_s": first, "phases": {"8": {"figures": figures}}, "error": error}


def test_medians_over_rounds_and_ratios_of_medians():
    runs = {"locals": [_round(10, 300), _round(12, 280), _round(30, 100, error="exited")],
            "mlx_lm.server": [_round(40, 100), _round(30, 90)]}
    s = summarise(runs, [8])
    assert s["locals"]["8"]["wait_s"] == {"median": 11.0, "min": 10, "max": 12, "n": 2}  # the failed round left out
    r = ratios(s)["mlx_lm.server"]
    assert r["8"]["wait_s"] == pytest.approx(11.0 / 35.0)
    assert r["8"]["output_tps"] == pytest.approx(290 / 95)
    assert r["cold"]["first_token_s"] == pytest.approx(1.0)


def test_the_table_shows_each_server_and_the_ratio():
    runs = {"locals": [_round(10, 300)], "mlx_lm.server": [_round(40, 100)]}
    report = {"rounds": 1, "agents": [8], "summary": summarise(runs, [8]), "failures": {
        "locals": {"rounds": 0, "8": 2}, "mlx_lm.server": {"rounds": 0, "8": 0}}}
    report["ratios"] = ratios(report["summary"])
    console = Console(record=True, width=160)
    console.print(table(report))
    text = console.export_text()
    assert "locals / mlx_lm.server" in text and "0.25×" in text and "3.00×" in text
    assert "failed requests" in text


def test_chunks_fold_into_the_reply():
    reply, last = Reply(0, 0, sent=1.0), [0.0]
    _read_chunk(reply, {"choices": [{"delta": {"role": "assistant", "content": ""}}]}, 1.1, last)
    assert reply.first is None  # the role chunk is no token
    _read_chunk(reply, {"choices": [{"delta": {"content": "Hi"}}]}, 1.5, last)
    _read_chunk(reply, {"choices": [{"delta": {"tool_calls": [
        {"index": 0, "id": "c1", "function": {"name": "read_file", "arguments": '{"pa'}}]}}]}, 1.7, last)
    _read_chunk(reply, {"choices": [{"delta": {"tool_calls": [
        {"index": 0, "function": {"arguments": 'th": "a"}'}}]}, "finish_reason": "tool_calls"}]}, 1.8, last)
    _read_chunk(reply, {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 7,
                                                 "prompt_tokens_details": {"cached_tokens": 4}}}, 1.9, last)
    assert reply.ttft == pytest.approx(0.5) and reply.gaps == pytest.approx([0.2, 0.1])
    assert (reply.text, reply.finish, reply.completion_tokens, reply.cached_tokens) == ("Hi", "tool_calls", 7, 4)
    assert reply.calls == {0: {"id": "c1", "name": "read_file", "arguments": '{"path": "a"}'}}
    follow = next_messages(reply, "file body")
    assert follow[0]["tool_calls"][0]["function"] == {"name": "read_file", "arguments": '{"path": "a"}'}
    assert follow[1] == {"role": "tool", "tool_call_id": "c1", "content": "file body"}
    assert next_messages(None, "hello") == [{"role": "user", "content": "hello"}]


def test_a_run_interleaves_fresh_servers_and_keeps_every_reply(tmp_path):
    bodies = tmp_path / "bodies.jsonl"
    plan = Plan((fake_server("a", "--bodies", str(bodies)), fake_server("b", "--no-usage")), agents=(1, 3),
                rounds=2, workload=Workload(turns=2, size_scale=0.02, time_scale=0.005))
    phases, saved = [], []
    report = run(plan, tmp_path / "logs", phases.append, on_round=lambda r: saved.append(len(r["runs"]["b"])))
    assert [p for p in phases if p][:4] == ["round 1 · a · 1 agent", "round 1 · a · 3 agents",
                                            "round 1 · b · 1 agent", "round 1 · b · 3 agents"]
    assert [p for p in phases if p][4].startswith("round 2 · b")  # order rotated
    assert phases.count(None) == 8 and saved == [0, 1, 2, 2]
    for name in ("a", "b"):
        for record in report["runs"][name]:
            assert 0 < record["ready_s"] < record["first_token_s"]
            replies = record["phases"]["3"]["replies"]
            assert len(replies["agents"]) == 6 and len(replies["burst"]) == 3
            assert all(r["error"] is None for r in replies["agents"] + replies["burst"])
    assert {r["counted"] for r in report["runs"]["b"][0]["phases"]["1"]["replies"]["agents"]} == {"chunks"}
    sent = [json.loads(line) for line in bodies.read_text().splitlines()]
    second = next(b for b in sent if len(b["messages"]) == 4)  # system, user, the server's reply, user
    assert second["messages"][2]["role"] == "assistant" and second["messages"][2]["content"].startswith(" w0 w1")
    assert report["ratios"] == {}  # no server named locals
    assert report["servers"]["a"]["command"][:2] == [Path(sys.executable).name, Path(FAKE).name]  # no machine paths
    assert report["summary"]["a"]["3"]["burst_tps"]["n"] == 2


def test_a_failing_server_is_recorded_and_its_agent_stops(tmp_path):
    plan = Plan((fake_server("a", "--fail-after", "1"),), agents=(1,), rounds=1,
                workload=Workload(turns=3, size_scale=0.02, time_scale=0.0))
    report = run(plan, tmp_path, lambda _: None)
    figures = report["runs"]["a"][0]["phases"]["1"]["figures"]
    assert figures["failed"] == 1 and figures["requests"] == 2  # one reply, one failure, no third turn nor burst
    assert report["failures"]["a"]["1"] == 1
    assert "HTTP 500" in report["runs"]["a"][0]["phases"]["1"]["replies"]["agents"][1]["error"]


def test_a_server_that_cannot_start_loses_its_round(tmp_path):
    spec = srv.ServerSpec("broken", (sys.executable, "-c", "import sys; print('no model here'); sys.exit(3)"),
                          "/health")
    with pytest.raises(LocalsError, match="no model here"):
        srv.start(spec, tmp_path / "broken.log", timeout_s=30)
    report = run(Plan((spec,), agents=(1,), rounds=1, workload=Workload()), tmp_path, lambda _: None)
    assert "exited (3)" in report["runs"]["broken"][0]["error"] and report["failures"]["broken"]["rounds"] == 1
    variant = srv.ServerSpec("locals nographs", spec.command, "/health")  # a variant's name has a space; its log not
    report = run(Plan((variant,), agents=(1,), rounds=1, workload=Workload()), tmp_path, lambda _: None)
    assert report["runs"]["locals nographs"][0]["log"] == "locals-nographs-round1.log"
    assert "no model here" in (tmp_path / "locals-nographs-round1.log").read_text()


def test_a_server_whose_preloaded_blas_is_gone_does_not_start(tmp_path):
    spec = srv.ServerSpec("a", (sys.executable, FAKE, "{port}"), "/health",
                          {"LD_PRELOAD": str(tmp_path / "libblas.so.3")})
    with pytest.raises(LocalsError, match="libblas.so.3 is gone"):
        srv.start(spec, tmp_path / "a.log", timeout_s=60)


def test_a_server_whose_health_says_failed_is_given_up_at_once(tmp_path):
    with pytest.raises(LocalsError, match="failed while starting"):
        srv.start(fake_server("broken", "--broken"), tmp_path / "broken.log", timeout_s=60)


@pytest.mark.skipif(sys.platform != "linux", reason="dying with the parent is Linux's PR_SET_PDEATHSIG")
def test_no_server_outlives_a_killed_benchmark(tmp_path):
    script = (f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
              "from pathlib import Path\nfrom locals.traffic import servers as srv\n"
              f"spec = srv.ServerSpec('a', ({sys.executable!r}, {FAKE!r}, '{{port}}'), '/health')\n"
              f"print(srv.start(spec, Path({str(tmp_path / 'a.log')!r}), 60).process.pid, flush=True)\n"
              "import time; time.sleep(60)\n")
    bench = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    server = psutil.Process(int(bench.stdout.readline()))
    bench.kill()
    bench.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and server.is_running() and server.status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.05)
    assert not server.is_running() or server.status() == psutil.STATUS_ZOMBIE


def test_the_time_limit_skips_rounds_that_would_overrun(tmp_path):
    plan = Plan((fake_server("a"),), agents=(1,), rounds=3, workload=Workload(turns=1, size_scale=0.01,
                                                                               time_scale=0.0),
                time_limit_s=0.001)
    report = run(plan, tmp_path, lambda _: None)
    errors = [r.get("error") for r in report["runs"]["a"]]
    assert errors[0] is None and all(e and e.startswith("skipped") for e in errors[1:])
    # What the summaries hold is said, not the rounds asked for (the table's title, the docs).
    assert rounds_text(report) == "1 round (3 asked)"
    assert "over 1 round (3 asked)" in table(report).title


def test_each_server_s_first_round_starts_whatever_another_server_took(tmp_path):
    # a's round takes 4 s or more (two requests of 2 s to a first token), b's well under 2.
    plan = Plan((fake_server("a", "--ttft", "2"), fake_server("b")), agents=(1,), rounds=2,
                workload=Workload(turns=1, size_scale=0.01, time_scale=0.0), time_limit_s=6.0)
    report = run(plan, tmp_path, lambda _: None)
    a_took = report["runs"]["a"][0]
    assert a_took.get("error") is None and a_took["phases"]["1"]["figures"]["wait_s"] >= 2
    # Judged by a's 4 s, b's first round would have been skipped; judged by its own, it runs.
    assert report["runs"]["b"][0].get("error") is None
    assert report["runs"]["a"][1]["error"].startswith("skipped")


def _report(runs, rounds, **extra):
    report = {"servers": {"locals": {}, "mlx_lm.server": {}}, "agents": [8], "workload": {"turns": 2},
              "model": "qwen3-4b", "backend": "cuda", "weights": {}, "rounds": rounds, "runs": runs, **extra}
    return finish(report)


def test_reports_of_commands_in_a_row_merge_into_one_run_s_rounds():
    first = _report({"locals": [_round(10, 300)], "mlx_lm.server": [_round(40, 100)]}, 1,
                    kernel_folders={"locals": 0, "mlx_lm.server": 0}, logs="a-logs")
    second = _report({"locals": [_round(12, 280), _round(14, 260)],
                      "mlx_lm.server": [_round(30, 90), _round(35, 95)]}, 2,
                     kernel_folders={"locals": 40, "mlx_lm.server": 90}, logs="b-logs")
    merged = merge([first, second], ["a.json", "b.json"])
    assert [r["round"] for r in merged["runs"]["locals"]] == [0, 1, 2] and merged["rounds"] == 3
    assert merged["summary"]["locals"]["8"]["wait_s"] == {"median": 12, "min": 10, "max": 14, "n": 3}
    assert merged["ratios"]["mlx_lm.server"]["8"]["wait_s"] == pytest.approx(12 / 35)
    assert merged["kernel_folders"] == [{"locals": 0, "mlx_lm.server": 0}, {"locals": 40, "mlx_lm.server": 90}]
    assert merged["merged_from"] == ["a.json", "b.json"] and merged["logs"] == ["a-logs", "b-logs"]
    assert rounds_text(merged) == "3 rounds"
    other = _report({"locals": [_round(12, 280)]}, 1) | {"agents": [16]}
    with pytest.raises(ValueError, match="b.json ran other agents than a.json"):
        merge([first, other], ["a.json", "b.json"])


def test_server_stats_are_none_for_a_peer_and_for_a_server_that_does_not_answer():
    import dataclasses

    gone = srv.Running(fake_server("a"), process=None, port=srv.free_port(), zero=0.0)  # nobody listens there
    assert srv.engine_stats(gone) is None  # no stats endpoint: a peer
    asking = dataclasses.replace(gone, spec=dataclasses.replace(gone.spec, stats_path="/v1/locals/status"))
    assert srv.engine_stats(asking) is None  # it has one, but nothing answers
