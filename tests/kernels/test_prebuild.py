"""MLX's quantized-matmul tiles built ahead by processes of their own (kernels/prebuild.py)."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import mlx.core as mx
import pytest

from locals.engine.kernels import prebuild
from tests.helpers.kernel_models import tiny_qwen3


def test_the_kinds_to_build_are_the_models_quantized_layers_dtype_bits_and_group():
    assert prebuild.quantized_kinds(tiny_qwen3(quantize=True)) == {("float32", 4, 64)}
    assert prebuild.quantized_kinds(tiny_qwen3(quantize=False)) == set()


@pytest.mark.parametrize("rows", prebuild.TILE_ROWS)
def test_the_build_process_runs_a_quantized_matmul_at_each_tiles_rows(rows):
    # The same script the server's processes run, on this machine's device (the CPU here).
    done = subprocess.run([sys.executable, "-c", prebuild.BUILD, "bfloat16", "4", "64", str(rows)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_nothing_is_built_ahead_where_mlx_compiles_no_cuda_kernels():
    assert mx.default_device() == mx.cpu
    assert prebuild.start(tiny_qwen3(quantize=True)) is None


def test_a_failing_build_is_logged_and_left_to_the_passes(caplog):
    build = prebuild.Prebuild({("no_such_dtype", 4, 64)})
    with caplog.at_level(logging.WARNING, logger="locals.engine.kernels.prebuild"):
        build.wait()
    assert len(build.processes) == 0
    assert "failed" in caplog.text and "no_such_dtype" in caplog.text


def test_a_build_past_its_time_is_stopped_and_the_start_goes_on(monkeypatch, caplog):
    monkeypatch.setattr(prebuild, "BUILD", "import time; time.sleep(60)")
    build = prebuild.Prebuild({("bfloat16", 4, 64)})
    processes = list(build.processes)
    with caplog.at_level(logging.WARNING, logger="locals.engine.kernels.prebuild"):
        build.wait(timeout_s=1.0)
    assert all(p.returncode is not None for p in processes)  # killed, not left running
    assert "took over 1 s" in caplog.text


def test_a_stop_while_building_ends_the_processes_without_a_warning(monkeypatch, caplog):
    monkeypatch.setattr(prebuild, "BUILD", "import time; time.sleep(60)")
    build = prebuild.Prebuild({("bfloat16", 4, 64)})
    processes = list(build.processes)
    began = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="locals.engine.kernels.prebuild"):
        build.wait(stop=lambda: True)
    assert time.perf_counter() - began < 10
    assert all(p.returncode is not None for p in processes) and not caplog.text


def test_tiles_already_on_disk_are_not_built_again(tmp_path):
    assert not prebuild._on_disk(tmp_path, "bfloat16", 4, 64)
    for rows in prebuild.TILE_ROWS[:-1]:
        (tmp_path / prebuild.MODULE_FILE.format(dtype="bfloat16", rows=rows, bits=4, group=64)).write_text("ptx")
    assert not prebuild._on_disk(tmp_path, "bfloat16", 4, 64)
    (tmp_path / prebuild.MODULE_FILE.format(dtype="bfloat16", rows=64, bits=4, group=64)).write_text("ptx")
    assert prebuild._on_disk(tmp_path, "bfloat16", 4, 64)
    assert not prebuild._on_disk(tmp_path, "bfloat16", 8, 64)


def test_a_start_without_a_process_to_be_had_goes_on_without_building_ahead(monkeypatch, caplog):
    def no_process(*args, **kwargs):
        raise OSError("no more processes")

    assert prebuild.launch(set()) is None
    monkeypatch.setattr(prebuild.subprocess, "Popen", no_process)
    with caplog.at_level(logging.WARNING, logger="locals.engine.kernels.prebuild"):
        assert prebuild.launch({("bfloat16", 4, 64)}) is None
    assert "no more processes" in caplog.text
