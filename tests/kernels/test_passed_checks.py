"""Kernel checks kept on disk (kernels/passed_checks.py): a pass skips the same check at a later
start with the same fingerprint; a failure, another fingerprint or a damaged file checks again."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest

from locals.engine.kernels import jit, passed_checks
from locals.engine.kernels.passed_checks import PassedChecks, fingerprint

DEVICE = {"device_name": "NVIDIA H200", "architecture": "sm_90", "uuid": "GPU-1", "free_memory": 1}


def _start(folder, monkeypatch, print_="f" * 64) -> PassedChecks:
    """A new process's view: its own verdicts, the kept checks read from `folder`."""
    kept = PassedChecks(folder, print_)
    monkeypatch.setattr(passed_checks, "_SHARED", [kept])
    return kept


class Check:
    def __init__(self, answer: str):
        self.answer, self.calls = answer, 0

    def __call__(self) -> str:
        self.calls += 1
        return self.answer


def test_a_pass_is_not_checked_again_at_the_next_start(tmp_path, monkeypatch):
    check = Check("")
    _start(tmp_path, monkeypatch)
    assert jit.remembered({}, "gated", ("k", 8, 2560), check) == ""
    _start(tmp_path, monkeypatch)  # a new process: an empty in-memory dict, the file read again
    assert jit.remembered({}, "gated", ("k", 8, 2560), check) == ""
    assert check.calls == 1
    # Another key or another kind of check is checked.
    assert jit.remembered({}, "gated", ("k", 16, 2560), check) == ""
    assert jit.remembered({}, "norm folded", ("k", 8, 2560), check) == ""
    assert check.calls == 3


def test_a_failure_is_checked_at_every_start(tmp_path, monkeypatch):
    check = Check("error 0.5 > 0.01")
    for _start_again in range(2):
        _start(tmp_path, monkeypatch)
        assert jit.remembered({}, "gated", "k", check) == "error 0.5 > 0.01"
    assert check.calls == 2
    assert not any(tmp_path.glob("*.json"))


def test_another_fingerprint_or_a_damaged_file_checks_again(tmp_path, monkeypatch):
    check = Check("")
    kept = _start(tmp_path, monkeypatch, "a" * 64)
    jit.remembered({}, "gated", "k", check)
    _start(tmp_path, monkeypatch, "b" * 64)  # another MLX, device or kernel source
    jit.remembered({}, "gated", "k", check)
    assert check.calls == 2
    kept.path.write_text("{not json")
    _start(tmp_path, monkeypatch, "a" * 64)
    jit.remembered({}, "gated", "k", check)
    assert check.calls == 3
    assert json.loads(kept.path.read_text())["passed"] == ["gated: 'k'"]


def test_no_store_checks_in_every_process(monkeypatch):
    check = Check("")
    monkeypatch.setattr(passed_checks, "_SHARED", [None])  # the CPU
    jit.remembered({}, "gated", "k", check)
    jit.remembered({}, "gated", "k", check)
    assert check.calls == 2


def test_an_unwritable_folder_only_costs_the_checks(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("")
    check = Check("")
    _start(blocked / "checks", monkeypatch)  # its parent is a file: nothing can be written
    assert jit.remembered({}, "gated", "k", check) == ""
    _start(blocked / "checks", monkeypatch)
    jit.remembered({}, "gated", "k", check)
    assert check.calls == 2


@pytest.mark.parametrize("change", ["source", "mlx", "device", "compiler"])
def test_the_fingerprint_covers_what_a_check_depends_on(tmp_path, change):
    (tmp_path / "kernel.py").write_text("SOURCE = 1\n")
    (tmp_path / "tuning").mkdir()
    (tmp_path / "tuning" / "verify.py").write_text("TOLERANCE = 0.01\n")
    before = fingerprint(tmp_path, "0.32.4", DEVICE, "nvrtc 13.0")
    args = {"mlx_version": "0.32.4", "device": DEVICE, "compiler": "nvrtc 13.0"}
    if change == "source":
        (tmp_path / "tuning" / "verify.py").write_text("TOLERANCE = 0.02\n")
    elif change == "mlx":
        args["mlx_version"] = "0.33.0"
    elif change == "device":
        args["device"] = {**DEVICE, "uuid": "GPU-2"}
    else:
        args["compiler"] = "nvrtc 13.1"
    assert fingerprint(tmp_path, **args) != before


def test_the_fingerprint_ignores_what_does_not_change_an_answer(tmp_path):
    (tmp_path / "kernel.py").write_text("SOURCE = 1\n")
    before = fingerprint(tmp_path, "0.32.4", DEVICE, "")
    (tmp_path / "notes.txt").write_text("not a source")
    assert fingerprint(tmp_path, "0.32.4", {**DEVICE, "free_memory": 2}, "") == before


def test_a_start_on_this_machine_finds_what_the_last_one_kept(monkeypatch):
    """The real fingerprint (this package's kernel sources, this MLX and device) is the same from
    one start to the next, so the pass is found; the CPU itself keeps none (`shared`)."""
    monkeypatch.setattr(passed_checks, "_SHARED", [])
    assert (passed_checks.shared() is None) == (mx.default_device() == mx.cpu)
    first = passed_checks._open()
    assert first is not None and len(first.fingerprint) == 64
    first.record("gated: 'k'")
    assert passed_checks._open().passed("gated: 'k'")
