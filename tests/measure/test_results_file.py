"""A benchmark's results file (benchmarks/common.py `write_results`) records the MLX settings the
run was started with, not those locals sets itself once the process loads a model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers.repo import REPO

SCRIPT = """
import sys
from benchmarks.common import write_results
from locals.engine.load.backend import cuda_launch_settings
cuda_launch_settings()  # as load_model does
print(write_results("mixed_pass", {"rounds": 1}, __import__("pathlib").Path(sys.argv[1])))
"""


def test_the_results_record_the_users_mlx_settings_not_locals_own(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_")}
    env["MLX_MAX_OPS_PER_BUFFER"] = "250"  # as a user chose
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "r.json")], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["mlx_env"] == {"MLX_MAX_OPS_PER_BUFFER": "250"} and data["rounds"] == 1
