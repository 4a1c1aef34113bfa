"""A benchmark's results file (benchmarks/common.py `write_results`) records the MLX settings the
user chose, not those locals set itself in the process (backend.SET_HERE)."""

from __future__ import annotations

import json

from benchmarks.common import write_results


def test_the_results_record_the_users_mlx_settings_not_locals_own(tmp_path, monkeypatch):
    monkeypatch.setattr("locals.engine.load.backend.SET_HERE", {"MLX_USE_CUDA_GRAPHS"})
    monkeypatch.setenv("MLX_USE_CUDA_GRAPHS", "0")  # as locals sets it
    monkeypatch.setenv("MLX_MAX_OPS_PER_BUFFER", "250")  # as a user chose
    path = write_results("mixed_pass", {"rounds": 1}, tmp_path / "r.json")
    data = json.loads(path.read_text())
    assert data["mlx_env"].get("MLX_MAX_OPS_PER_BUFFER") == "250"
    assert "MLX_USE_CUDA_GRAPHS" not in data["mlx_env"]
    assert data["rounds"] == 1
