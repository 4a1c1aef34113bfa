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
    schema.write_text("false")  # valid JSON, but no schema: refused, not ignored
    proc = run_cli("generate", "--model", "smollm2", "--prompt", "hi", "--schema", str(schema))
    _one_clear_line(proc, "a JSON schema is an object")


def test_an_empty_prompt_is_refused_not_answered():
    _one_clear_line(run_cli("generate", "--prompt", "  "), "the prompt is empty")
    proc = subprocess.run([sys.executable, "-m", "locals", "generate", "-p", "-"], input="\n", capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    _one_clear_line(proc, "the prompt is empty")


def test_an_empty_schema_still_constrains_the_answer_to_json(tmp_path):
    import json

    schema = tmp_path / "any.json"
    schema.write_text("{}")  # any JSON value: the answer must still parse
    proc = run_cli("generate", "--model", "smollm2", "--prompt", "Ana Silva, 29, ana@example.com",
                   "--schema", str(schema), "--max-tokens", "24", "-t", "0")
    assert proc.returncode == 0, proc.stderr
    json.loads(proc.stdout)


def test_out_of_range_sampling_options_are_one_clear_line():
    for args, needle in ((("--max-tokens", "0"), "--max-tokens"), (("--top-p", "5"), "--top-p"),
                         (("--temperature", "-1"), "--temperature"), (("--temperature", "inf"), "finite")):
        _one_clear_line(run_cli("generate", "--prompt", "hi", *args), needle)
    _one_clear_line(run_cli("chat", "--max-tokens", "-5"), "--max-tokens")


def test_a_folder_mlx_lm_cannot_load_is_one_clear_line(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    _one_clear_line(run_cli("generate", "--model", str(empty), "--prompt", "hi"), "not a model folder")
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "config.json").write_text('{"model_type": "nosuch"}')
    (odd / "model.safetensors").write_bytes(b"")
    _one_clear_line(run_cli("generate", "--model", str(odd), "--prompt", "hi"), "not a model folder")


def test_ports_and_log_lines_out_of_range_are_usage_errors():
    for args in (("serve", "--port", "70000"), ("start", "--port", "0"), ("status", "--logs", "-n", "0"),
                 ("run", "x", "--port", "-1")):
        proc = run_cli(*args)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (args, proc.stderr)
    _one_clear_line(run_cli("status", "-n", "5"), "--lines goes with --logs")  # never silently ignored


def test_help_lists_only_working_commands():
    proc = run_cli("--help")
    assert proc.returncode == 0
    for command in ("generate", "chat", "models"):
        assert command in proc.stdout


def test_switches_read_as_switches_in_help():
    proc = run_cli("run", "--help")
    assert proc.returncode == 0 and "--keep" in proc.stdout
    assert "<bool>" not in proc.stdout  # as a switch would show if it took a value (typer 0.29)


def test_version_names_backend_and_blas():
    proc = run_cli("--version")
    assert proc.returncode == 0
    assert "backend cpu" in proc.stdout and "blas" in proc.stdout


def test_models_lists_aliases():
    proc = run_cli("models")
    assert proc.returncode == 0, proc.stderr
    for alias in ("qwen", "lfm", "minicpm", "gemma", "smollm2"):
        assert alias in proc.stdout
    assert "mlx-community/Qwen3.5-4B-MLX-4bit" in proc.stdout  # piped, repo ids stay whole


def test_what_fits_counts_float32_weights_on_a_cpu():
    from locals.engine.load.models_list import loaded_bytes

    assert loaded_bytes(1e9, "mlx-community/Qwen3-4B-4bit", dense=False) == 1e9
    assert loaded_bytes(1e9, "mlx-community/Qwen3-4B-4bit", dense=True) == 8e9
    assert loaded_bytes(1e9, "org/Model-8bit", dense=True) == 4e9
    assert loaded_bytes(1e8, "embedded:SmolLM2-135M-Instruct.Q4_1.gguf", dense=True) == 8e8
    assert loaded_bytes(1e9, "org/model-bf16", dense=True) == 2e9


@pytest.mark.model
def test_generate_answers_paris():
    proc = run_cli("generate", "--model", "smollm2", "--prompt", "What is the capital of France?",
                   "--temperature", "0", "--max-tokens", "40")
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout
    assert "tok/s" in proc.stderr


def test_a_request_that_can_never_fit_is_an_error_not_an_empty_answer(tmp_path):
    proc = run_cli("generate", "--model", "smollm2", "--prompt", "hi", "--max-tokens", "100000000")
    _one_clear_line(proc, "--max-tokens")
    assert proc.stdout == ""
    schema = tmp_path / "person.json"
    schema.write_text('{"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}')
    proc = run_cli("generate", "--model", "smollm2", "--prompt", "hi", "--schema", str(schema), "--max-tokens", "3")
    _one_clear_line(proc, "--max-tokens=3 is too small")


def test_chat_takes_a_mistyped_command_for_one_and_goes_on():
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "locals", "chat", "--model", "smollm2", "--max-tokens", "4",
                           "-t", "0"], input="/help\nWhat is 2+2?\n/quit\n", capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "unknown command /help" in proc.stderr and "/reset" in proc.stderr
    assert "(cut at --max-tokens)" in proc.stderr  # the one real turn, cut at 4 tokens


def test_a_prompt_of_dash_is_read_from_stdin():
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "locals", "generate", "--model", "smollm2", "-p", "-",
                           "--max-tokens", "8", "-t", "0"], input="What is the capital of France?\n",
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout or "capital" in proc.stdout, proc.stdout  # it answered the question
