"""Where MLX keeps compiled CUDA kernels: locals' cache unless the user chose a place."""

import os

import mlx.core as mx

from locals.engine.backend import keep_compiled_kernels


def test_compiled_kernels_go_to_the_locals_cache_per_mlx_version(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALS_HOME", str(tmp_path))
    monkeypatch.delenv("MLX_PTX_CACHE_DIR", raising=False)  # restored after the test
    keep_compiled_kernels()
    assert os.environ["MLX_PTX_CACHE_DIR"] == str(tmp_path / "cache" / "cuda-kernels" / mx.__version__)


def test_a_users_own_kernel_cache_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALS_HOME", str(tmp_path))
    monkeypatch.setenv("MLX_PTX_CACHE_DIR", "/elsewhere")
    keep_compiled_kernels()
    assert os.environ["MLX_PTX_CACHE_DIR"] == "/elsewhere"
