"""The `locals` command as users run it: clear one-line errors, --help, --version, models."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def run_cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "locals", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _one_clear_line(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert needle in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr


def test_unknown_repo_is_one_clear_line():
    proc = run_cli("generate", "--model", "no/such-model", "--prompt", "hi")
    _one_clear_line(proc, "no/such-model")


def test_missing_gguf_is_one_clear_line(tmp_path):
    proc = run_cli("generate", "--model", str(tmp_path / "x.gguf"), "--prompt", "hi")
    _one_clear_line(proc, "no such GGUF file")


def test_unsupported_gguf_is_one_clear_line(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 64)
    proc = run_cli("generate", "--model", str(bad), "--prompt", "hi")
    _one_clear_line(proc, "x.gguf")


def test_bad_schema_file_is_one_clear_line(tmp_path):
    schema = tmp_path / "s.json"
    schema.write_text("{not json")
    proc = run_cli("generate", "--model", "smollm2", "--prompt", "hi", "--schema", str(schema))
    _one_clear_line(proc, "not valid JSON")


def test_help_lists_only_working_commands():
    proc = run_cli("--help")
    assert proc.returncode == 0
    for command in ("generate", "chat", "models"):
        assert command in proc.stdout


def test_version_names_backend_and_blas():
    proc = run_cli("--version")
    assert proc.returncode == 0
    assert "backend cpu" in proc.stdout and "blas" in proc.stdout


def test_models_lists_aliases():
    proc = run_cli("models")
    assert proc.returncode == 0, proc.stderr
    for alias in ("qwen", "lfm", "minicpm", "gemma", "smollm2"):
        assert alias in proc.stdout


@pytest.mark.model
def test_generate_answers_paris():
    proc = run_cli("generate", "--model", "smollm2", "--prompt", "What is the capital of France?",
                   "--temperature", "0", "--max-tokens", "40")
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout
    assert "tok/s" in proc.stderr
