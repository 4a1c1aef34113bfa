"""benchmarks/process_spread.py end to end on the CPU: fresh child processes, alternating
LOCALS_HOME folders, every sample kept in the JSON (a tiny random Qwen3; no speeds asserted)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.repo import REPO


@pytest.mark.slow
def test_children_alternate_homes_and_every_sample_is_kept(tmp_path):
    homes = [tmp_path / "a", tmp_path / "b"]
    cmd = [sys.executable, str(REPO / "benchmarks" / "process_spread.py"), "--random-model", "qwen3-tiny",
           "--batches", "1,2", "--processes", "2", "--rounds", "2", "--tokens", "3", "--prompt-len", "8",
           "--homes", ",".join(map(str, homes)), "--timeout", "240"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    path = Path(done.stdout.strip().splitlines()[-1].removeprefix("results: "))
    try:
        data = json.loads(path.read_text())
    finally:
        path.unlink()
    assert data["benchmark"] == "process_spread" and data["model"] == "qwen3-tiny"
    assert {(r["setting"], r["batch"]) for r in data["rows"]} == {(str(h), b) for h in homes for b in (1, 2)}
    for row in data["rows"]:
        assert len(row["samples"]) == 2 and all(len(s) == 2 and min(s) > 0 for s in row["samples"])
        assert row["across_processes"]["n"] == 2
        assert row["process_medians"] == [statistics.median(s) for s in row["samples"]]
    # Four children ran, one after another, two per home.
    assert sum(line.startswith("process ") for line in done.stdout.splitlines()) == 4


def test_settings_pair_every_home_with_every_environment():
    sys.path.insert(0, str(REPO))
    from benchmarks.process_spread import settings

    assert settings("", "") == [(None, "", "default")]
    assert settings("a,b", "") == [("a", "", "a"), ("b", "", "b")]
    assert settings("", "X=1 Y=2; X=3") == [(None, "X=1 Y=2", "X=1 Y=2"), (None, "X=3", "X=3")]
    assert [name for _h, _e, name in settings("a,b", "X=1;X=2")] == ["a X=1", "a X=2", "b X=1", "b X=2"]
