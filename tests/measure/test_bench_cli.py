"""`locals bench` as users run it: the served-traffic report (slow: real servers), the
in-process diagnostic's report with every sample, a refusal on a busy machine, clear errors for
bad options; and the measuring helpers it shares with benchmarks/."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from locals.engine.bench import all_rows_rate, timing
from locals.measure import interleaved, summary


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "locals", *args], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, COLUMNS="200", **env))


def test_interleaved_rotates_order_and_keeps_every_sample():
    calls = []
    runners = {name: (lambda name=name: calls.append(name) or {"x": len(calls)}) for name in ("a", "b", "c")}
    out = interleaved(3, runners)
    assert calls[:3] == ["a", "b", "c"]  # warm-up
    assert calls[3:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert [len(v) for v in out.values()] == [3, 3, 3]


def test_timing_counts_decode_after_the_last_first_token():
    t = timing(0.0, firsts=[1.0, 2.0], ends=[4.0, 3.0], n_tokens=5, batch=2)
    assert t["decode_tps"] == pytest.approx(2 * 4 / 2.0)
    assert t["ttft_s"] == 2.0 and t["wall_s"] == 4.0
    assert summary([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}


def test_all_rows_rate_counts_only_the_time_every_row_decodes():
    # Row a decodes from t=1 to 4, row b (a longer prompt) from 2 to 6, two tokens at t=3.
    a = [(1.0, 1), (2.0, 1), (3.0, 1), (4.0, 1)]
    b = [(2.0, 1), (3.0, 2), (5.0, 1), (6.0, 1)]
    assert all_rows_rate([a, b]) == pytest.approx((2 + 2) / 2.0)  # t in (2, 4]: a's 3, 4 and b's pair at 3
    t = timing(0.0, firsts=[1.0, 2.0], ends=[4.0, 6.0], n_tokens=4, batch=2, stamps=[a, b])
    assert t["all_rows_tps"] == pytest.approx(2.0) and t["decode_tps"] == pytest.approx(2 * 3 / 4.0)
    assert all_rows_rate([[(1.0, 1), (2.0, 1)], [(3.0, 1), (4.0, 1)]]) is None  # never both at once


@pytest.mark.model
def test_bench_engine_writes_a_report_with_every_sample(tmp_path):
    out = tmp_path / "report.json"
    proc = run_cli("bench", "--engine", "--model", "smollm2", "--batches", "1,2", "--tokens", "4",
                   "--prompt-len", "8", "--rounds", "2", "--force", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "locals / mlx-lm" in proc.stdout and str(out) in proc.stdout.replace("\n", "")
    report = json.loads(out.read_text())
    assert [row["batch"] for row in report["rows"]] == [1, 2]
    for row in report["rows"]:
        for name in ("locals", "mlx-lm"):
            assert len(row[name]["samples"]) == 2 and row[name]["decode_tps"]["median"] > 0
    assert report["machine"]["mlx"] and report["model"] == "smollm2"


def test_bench_refuses_on_a_busy_machine_unless_forced(monkeypatch):
    from locals import measure
    from locals.cli import bench
    from locals.errors import LocalsError

    monkeypatch.setattr(measure, "other_cpu_percent", lambda interval=1.0: 90.0)
    with pytest.raises(LocalsError, match="--force"):
        bench._check_quiet(force=False)
    assert bench._check_quiet(force=True) == 90.0


def test_variants_run_locals_again_with_their_settings_beside_the_others(tmp_path):
    from locals.cli.bench_traffic import parse_variants, with_variants
    from locals.errors import LocalsError
    from locals.traffic import servers as srv

    variants = parse_variants(["graphs400:MLX_CUDA_GRAPH_CACHE_SIZE=400", "small:LOCALS_KV_BUDGET_MB=512,A=b=c"])
    assert variants == {"locals graphs400": {"MLX_CUDA_GRAPH_CACHE_SIZE": "400"},
                        "locals small": {"LOCALS_KV_BUDGET_MB": "512", "A": "b=c"}}
    ours = srv.locals_server("m", {"MLX_PTX_CACHE_DIR": str(tmp_path / "cuda-kernels-locals")})
    peer = srv.mlx_lm_server("m")
    specs, weights = with_variants([ours, peer], {"locals": "m (folder)", "mlx_lm.server": "m"}, variants)
    assert [s.name for s in specs] == ["locals", "locals graphs400", "locals small", "mlx_lm.server"]
    graphs = specs[1]
    assert graphs.command == ours.command and graphs.stats_path == ours.stats_path
    # the same kernel folder as locals (one server runs at a time): the A/B starts as warm as locals
    kernels = str(tmp_path / "cuda-kernels-locals")
    assert graphs.env == {"MLX_PTX_CACHE_DIR": kernels, "MLX_CUDA_GRAPH_CACHE_SIZE": "400"}
    assert ours.env == {"MLX_PTX_CACHE_DIR": str(tmp_path / "cuda-kernels-locals")}  # locals itself untouched
    assert weights["locals graphs400"] == "m (folder); MLX_CUDA_GRAPH_CACHE_SIZE=400"
    assert with_variants([ours, peer], {}, {}) == ([ours, peer], {})
    for bad in ("graphs400", "graphs400:", ":A=1", "two words:A=1", "x:A"):
        with pytest.raises(LocalsError, match="NAME:VAR=VALUE"):
            parse_variants([bad])
    with pytest.raises(LocalsError, match="include locals"):
        with_variants([peer], {"mlx_lm.server": "m"}, variants)


def test_bench_bad_options_are_one_line_errors():
    for args, needle in ((("--engine", "--batches", "0,2"), "between 1 and 256"),
                         (("--engine", "--batches", "x"), "--batches"), (("--engine", "--tokens", "1"), "--tokens"),
                         (("--agents", "0,8"), "--agents"), (("--servers", "locals,vllm"), "--servers"),
                         (("--turns", "0"), "--turns 0: use at least 1"),
                         (("--size-scale", "0"), "--size-scale 0: use more than 0"),
                         (("--engine", "--agents", "2"), "--agents shapes the served traffic"),
                         (("--servers", "llama.cpp", "--engine"), "--servers shapes the served traffic"),
                         (("--batches", "1",), "--batches is for --engine")):
        proc = run_cli("bench", *args)
        assert proc.returncode == 1 and needle in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_bench_out_may_be_a_folder_and_a_bad_one_fails_before_measuring(tmp_path, locals_home):
    from locals.cli.bench import _report_path
    from locals.errors import LocalsError

    inside = _report_path(tmp_path)
    assert inside.parent == tmp_path and inside.name.startswith("bench-") and inside.suffix == ".json"
    assert _report_path(tmp_path / "new" / "r.json") == tmp_path / "new" / "r.json"
    assert (tmp_path / "new").is_dir()
    fresh = _report_path(tmp_path / "results")  # `--out results/`: the slash is gone by the time it arrives
    assert fresh.parent == tmp_path / "results" and (tmp_path / "results").is_dir()
    assert _report_path(None).parent == locals_home / "state" / "bench"
    (tmp_path / "file").write_text("x")
    with pytest.raises(LocalsError, match="--out"):
        _report_path(tmp_path / "file" / "r.json")  # its folder would be a file
    (tmp_path / "dangling.json").symlink_to(tmp_path / "gone" / "r.json")
    with pytest.raises(LocalsError, match="cannot write"):
        _report_path(tmp_path / "dangling.json")  # its folder exists, the file cannot be written
    assert not (tmp_path / "new" / "r.json").exists()  # the probe leaves no empty report behind


@pytest.mark.slow
@pytest.mark.model
def test_bench_serves_traffic_to_locals_and_mlx_lm_server(tmp_path):
    """The default benchmark, briefly: both servers fresh, the embedded model (rounds and their
    order: tests/measure/test_traffic.py)."""
    out = tmp_path / "report.json"
    proc = run_cli("bench", "--model", "smollm2", "--agents", "1,2", "--rounds", "1", "--turns", "1",
                   "--size-scale", "0.04", "--time-scale", "0.01", "--servers", "locals,mlx_lm.server",
                   "--force", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "locals / mlx_lm.server" in proc.stdout and "burst tok/s" in proc.stdout
    report = json.loads(out.read_text())
    assert list(report["runs"]) == ["locals", "mlx_lm.server"] and report["model"] == "smollm2"
    for name, rounds in report["runs"].items():
        assert len(rounds) == 1
        for record in rounds:
            assert not record.get("error") and 0 < record["ready_s"] < record["first_token_s"], record
            for n in ("1", "2"):
                figures = record["phases"][n]["figures"]
                assert figures["failed"] == 0 and figures["output_tokens"] > 0, (name, n, figures)
                assert figures["tokens_counted"] == ["usage"]
                stats = record["phases"][n]["server_stats"]  # what the server says of its own steps
                if name == "locals":
                    assert stats["step_intervals"]["decode"]["steps"] > 0 and stats["slow_steps"] >= 0, stats
                else:
                    assert stats is None
    assert report["ratios"]["mlx_lm.server"]["2"]["burst_tps"] > 0
    assert "dense float32" in report["weights"]["mlx_lm.server"]
    assert (tmp_path / "report-logs" / "locals-round1.log").exists()


def test_peer_args_start_a_peer_as_a_user_tuned_it_and_the_report_says_so():
    from locals.cli.bench_traffic import parse_peer_args, with_peer_args
    from locals.errors import LocalsError
    from locals.traffic import servers as srv

    peers = parse_peer_args(["mlx_lm.server=--prompt-concurrency 2", "mlx_lm.server=--prefill-step-size '1024'"])
    assert peers == {"mlx_lm.server": ("--prompt-concurrency", "2", "--prefill-step-size", "1024")}
    ours, peer = srv.locals_server("m"), srv.mlx_lm_server("m")
    specs, weights = with_peer_args([ours, peer], {"locals": "m (folder)", "mlx_lm.server": "m"}, peers)
    assert specs[0] == ours and specs[1].command == (*peer.command, *peers["mlx_lm.server"])
    assert specs[1].name == "mlx_lm.server" and specs[1].env == peer.env  # still the peer the paper compares
    assert weights == {"locals": "m (folder)",
                       "mlx_lm.server": "m; run with --prompt-concurrency 2 --prefill-step-size 1024"}
    assert with_peer_args([ours, peer], {}, {}) == ([ours, peer], {})
    for bad in ("mlx_lm.server", "mlx_lm.server=", "locals=--port 1", "vllm=--x 1", "=--x"):
        with pytest.raises(LocalsError, match="SERVER=ARGS"):
            parse_peer_args([bad])
    with pytest.raises(LocalsError, match="add it to --servers"):
        with_peer_args([ours], {"locals": "m"}, peers)
    with pytest.raises(LocalsError, match="add it to --servers"):  # found with the arguments, before measuring
        parse_peer_args(["mlx_lm.server=--prompt-concurrency 2"], ["locals", "llama.cpp"])
    assert parse_peer_args(["llama.cpp=--n_ctx 4096"], None) == {"llama.cpp": ("--n_ctx", "4096")}


def test_bench_cli_refuses_bad_peer_args_before_measuring(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from locals.cli import app, bench

    monkeypatch.setattr(bench, "_check_quiet", lambda force: pytest.fail("measured despite bad input"))
    result = CliRunner().invoke(app, ["bench", "--peer-args", "nginx=-t", "--out", str(tmp_path)])
    assert result.exit_code != 0 and "SERVER=ARGS" in str(result.exception)  # the CLI prints it as an error
    result = CliRunner().invoke(app, ["bench", "--servers", "locals", "--peer-args", "mlx_lm.server=--x 1"])
    assert result.exit_code != 0 and "add it to --servers" in str(result.exception)


def test_a_bench_stopped_by_ctrl_c_says_what_it_kept(tmp_path, monkeypatch, capsys):
    import typer

    from locals.cli import bench_traffic
    from locals.traffic import run as traffic_run
    from locals.traffic.workload import Workload

    monkeypatch.setattr(bench_traffic, "server_specs", lambda *a, **kw: ([], {}))

    def interrupted(plan, log_dir, on_phase, on_round):
        raise KeyboardInterrupt

    monkeypatch.setattr(traffic_run, "run", interrupted)
    path = tmp_path / "bench.json"
    plan = {"agents": (1,), "rounds": 1, "workload": Workload()}
    with pytest.raises(typer.Exit) as stopped:
        bench_traffic.traffic_bench("smollm2", plan, None, path, 0.0)
    assert stopped.value.exit_code == 130
    assert "stopped: no round had finished: no report; server logs in" in capsys.readouterr().err
    path.write_text("{}")  # a round saved before the stop
    with pytest.raises(typer.Exit):
        bench_traffic.traffic_bench("smollm2", plan, None, path, 0.0)
    assert f"the rounds done so far are in {path}" in capsys.readouterr().err.replace("\n", "")
