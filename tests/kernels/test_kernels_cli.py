"""`locals tune` as users run it: tuning explicit shapes on this device, the report, clear errors."""

from __future__ import annotations

import os
import subprocess
import sys


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "locals", *args], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, COLUMNS="200"))


def test_tune_report_without_results_says_how_to_make_them():
    proc = run_cli("tune", "--report")
    assert proc.returncode == 0, proc.stderr  # nothing stored is an answer, not an error
    # On a CPU models have nothing to tune (dense weights): the hint names --shape.
    assert "nothing stored" in proc.stdout and "`locals tune --shape OUTxIN`" in proc.stdout


def test_tune_shape_then_report(locals_home):
    proc = run_cli("tune", "--shape", "33x128", "--rows", "1-2", "--rounds", "1", "--dtype", "float32")
    assert proc.returncode == 0, proc.stderr
    assert "q4-g64-float32-33x128" in proc.stdout
    # Not a terminal: a timestamped line a step, counting the pairs (a log shows where time went).
    assert "0/2 pairs] verifying" in proc.stderr and "1/2 pairs] q4-g64-float32-33x128 M=2" in proc.stderr
    saved = list((locals_home / "cache" / "tuning").glob("*.json"))
    assert len(saved) == 1
    report = run_cli("tune", "--report")
    assert report.returncode == 0, report.stderr
    assert "q4-g64-float32-33x128" in report.stdout and "vs MLX" in report.stdout


def test_tune_bad_options_are_one_line_errors():
    for args, needle in ((("--shape", "33x100"), "multiple of the group size"),
                         (("--shape", "abc"), "OUTxIN"),
                         (("--shape", "33x128", "--rows", "0-40"), "within 1-32"),
                         (("--shape", "33x128", "--bits", "3"), "--bits 3: use 4 or 8"),
                         (("--shape", "64x64", "--group-size", "0"), "--group-size 0: use 32, 64 or 128"),
                         (("--shape", "64x96", "--group-size", "48"), "--group-size"),
                         (("--shape", "64x128", "--rounds", "0"), "--rounds 0: use at least 1")):
        proc = run_cli("tune", *args)
        assert proc.returncode == 1 and needle in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
        assert args[-2] == "--shape" or proc.stderr.count("--") == 1  # only the option given is named


def test_tune_refuses_options_it_would_ignore():
    for args, needle in ((("--report", "--fresh"), "drop --fresh or --report"),
                         (("--model", "smollm2", "--shape", "64x64"), "not both"),
                         (("--bits", "8",), "--bits describes a --shape")):
        proc = run_cli("tune", *args)
        assert proc.returncode == 1 and needle in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr)


def test_status_says_what_compiling_ahead_has_done():
    from locals.cli.daemon import compiles_line

    assert compiles_line({}) is None  # an engine that compiles nothing ahead
    assert compiles_line({"compiled_shapes": 66, "compile_seconds": 4.04, "compiling_ahead": True,
                          "uncompiled_passes": 3, "slow_steps": 0, "slowest_step_s": 0.8}) == (
        "66 shapes ahead in 4 s (compiling more while idle); 3 passes ran uncompiled")
    assert compiles_line({"compiled_shapes": 81, "compile_seconds": 51.0, "compiling_ahead": False,
                          "uncompiled_passes": 0, "slow_steps": 2, "slowest_step_s": 31.12}) == (
        "81 shapes ahead in 51 s (all compiled); 0 passes ran uncompiled; 2 steps of 2 s or more (longest 31.1 s)")


def test_status_says_how_often_streams_stalled_and_where():
    from locals.cli.daemon import gaps_line

    assert gaps_line({}) is None and gaps_line({"long_gaps": {"count": 0, "ms_by_phase": {}}}) is None
    gaps = {"count": 31, "ms_by_phase": {"build": 4866.2, "disk copy": 212.4, "admit": 138.9}}
    assert gaps_line({"long_gaps": gaps}) == "31 between steps (build 4.9 s, disk copy 0.2 s)"


def test_status_says_what_the_kernels_are_doing():
    from locals.cli.daemon import kernels_line

    assert kernels_line({}) is None  # a CPU: nothing to say
    assert kernels_line({"tuned_layers": 0, "untuned_pairs": 0}) is None
    assert kernels_line({"tuned_layers": 108, "untuned_pairs": 0}) == "108 layers use tuned kernels"
    assert kernels_line({"tuned_layers": 0, "untuned_pairs": 35}) == (
        "0 layers use tuned kernels; 35 layer shape x row count pairs untuned (run `locals tune`)")
    assert kernels_line({"tuned_layers": 144, "fused_kernel_layers": {"heads": 36, "norms": 36}}) == (
        "144 layers use tuned kernels; fused q/k norm + RoPE in 36 layers, add + norm in 36 layers")
    assert kernels_line({"fused_kernel_layers": {"heads": 0, "norms": 0}}) is None
    assert kernels_line({"tuned_layers": 252, "fused_kernel_layers": {"heads": 36, "norms": 36},
                         "folded_in_matmuls": {"norms": 72, "activations": 0}}) == (
        "252 layers use tuned kernels; fused q/k norm + RoPE in 36 layers, add + norm in 36 layers; "
        "add + norm inside 72 matmuls")
    assert kernels_line({"tuned_layers": 180, "folded_in_matmuls": {"norms": 72, "activations": 36}}) == (
        "180 layers use tuned kernels; add + norm inside 72 matmuls; SwiGLU inside 36 matmuls")


def test_rows_take_counts_and_ranges_in_the_order_given():
    import pytest

    from locals.cli.tune import _parse_rows
    from locals.errors import LocalsError

    assert _parse_rows("1-16") == list(range(1, 17))
    assert _parse_rows("8,16,2-4,8") == [8, 16, 2, 3, 4]
    assert _parse_rows("17-32") == list(range(17, 33))
    for bad in ("0", "3-40", "8,,2", "x"):
        with pytest.raises(LocalsError, match="within 1-32"):
            _parse_rows(bad)


def test_tune_only_tries_the_named_candidates(locals_home):
    import json

    proc = run_cli("tune", "--shape", "33x128", "--rows", "2", "--rounds", "1", "--dtype", "float32",
                   "--only", "pad8")
    assert proc.returncode == 0, proc.stderr
    table = json.loads(next((locals_home / "cache" / "tuning").glob("*.json")).read_text())
    timed = table["timings_us"]["q4-g64-float32-33x128"]["2"]
    assert set(timed) == {"mlx", "mlx-pad8"}, timed
    proc = run_cli("tune", "--shape", "33x128", "--only", "no-such-kernel")
    assert proc.returncode == 1 and "matches no candidate" in proc.stderr and "Traceback" not in proc.stderr
