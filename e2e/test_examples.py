"""Every program in docs/examples/ runs against a real daemon on the embedded model and
prints what its README promises.

Examples are found in the folder, so a new one fails here until it has a check in CHECKS.
The curl snippets of docs/serve.md are run by test_api_curl_examples.py.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

FOLDER = Path(__file__).resolve().parents[1] / "docs" / "examples"
EXAMPLES = sorted(p.name for p in FOLDER.iterdir() if p.suffix in (".py", ".sh"))
RUNNERS = {".py": [sys.executable], ".sh": ["bash"]}
COUNTS = re.compile(r"\[(\d+) prompt tokens, (\d+) generated\]")


def _line(out: str, prefix: str) -> str:
    """The rest of the first line that starts with prefix."""
    found = [line[len(prefix):] for line in out.splitlines() if line.startswith(prefix)]
    assert found, f"no line starting with {prefix!r} in:\n{out}"
    return found[0]


def _streamed_chat(out: str) -> None:
    assert "Paris" in out
    prompt, generated = (int(n) for n in COUNTS.search(out).groups())
    assert prompt > 10 and generated > 0


def _json_first_line(keys: set[str]):
    def check(out: str) -> dict:
        data = json.loads(out.splitlines()[0])
        assert set(data) == keys, data
        return data
    return check


def _person(out: str) -> None:
    data = _json_first_line({"name", "age", "email"})(out)
    assert isinstance(data["age"], int) and data["age"] >= 0
    assert f"age={data['age']}" in out


def _openai_tools(out: str) -> None:
    call = re.fullmatch(r"get_weather\((.*)\)", _line(out, "tool call: "))
    assert call, out
    assert isinstance(json.loads(call.group(1))["city"], str)
    assert _line(out, "answer: ").strip()


def _anthropic_tools(out: str) -> None:
    call = re.fullmatch(r"get_weather\((.*)\)", _line(out, "tool_use: "))
    assert call, out
    assert isinstance(ast.literal_eval(call.group(1))["city"], str)  # printed as a Python dict
    assert "answer: " in out
    assert re.search(r"\[stop_reason (end_turn|max_tokens); \d+ input tokens, \d+ read from", out)


def _curl_sections(out: str) -> dict[str, str]:
    parts = re.split(r"^### (.+)$", out, flags=re.MULTILINE)
    return {name.strip(): body.strip() for name, body in zip(parts[1::2], parts[2::2])}


def _curl(out: str) -> None:
    sections = _curl_sections(out)
    script = (FOLDER / "curl.sh").read_text()
    assert len(sections) == script.count('echo "### '), list(sections)
    for name, body in sections.items():
        if body.startswith("data: "):
            assert body.endswith("data: [DONE]") and "Paris" in body, name
        else:
            assert json.loads(body).get("error") is None, (name, body)
    place = json.loads(json.loads(sections["openai json schema"])["choices"][0]["message"]["content"])
    assert set(place) == {"city", "country"}
    calls = json.loads(sections["openai tool call"])["choices"][0]["message"]["tool_calls"]
    assert calls[0]["function"]["name"] == "get_weather"
    assert "city" in json.loads(calls[0]["function"]["arguments"])
    blocks = json.loads(sections["anthropic messages with a tool"])["content"]
    assert [b["name"] for b in blocks if b["type"] == "tool_use"][0] == "get_weather"
    assert "Paris" in json.loads(sections["ollama chat"])["message"]["content"]
    assert "city" in json.loads(json.loads(sections["ollama generate with a format schema"])["response"])
    assert "Paris" in json.loads(sections["openai responses"])["output"][0]["content"][0]["text"]


CHECKS = {
    "openai_stream.py": _streamed_chat,
    "openai_json_schema.py": _person,
    "openai_tools.py": _openai_tools,
    "anthropic_tools.py": _anthropic_tools,
    "ollama_chat.py": _streamed_chat,
    "ollama_generate_json.py": _json_first_line({"city", "country"}),
    "curl.sh": _curl,
}


def test_every_example_has_a_check():
    assert [name for name in EXAMPLES if name not in CHECKS] == [], "add a check to CHECKS"
    assert [name for name in CHECKS if name not in EXAMPLES] == [], "a check names no example"


def test_readme_lists_every_example():
    readme = (FOLDER / "README.md").read_text()
    assert [name for name in EXAMPLES if f"]({name})" not in readme] == []


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_reads_the_base_url(name):
    # The test daemon is not on 8321: an example that ignores LOCALS_URL would hit another server.
    source = (FOLDER / name).read_text()
    assert "LOCALS_URL" in source and "http://127.0.0.1:8321" in source


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs(locals_server, tmp_path, name):
    assert name in CHECKS, f"docs/examples/{name} has no check: add one to CHECKS in {Path(__file__).name}"
    path = FOLDER / name
    env = {**locals_server.env, "LOCALS_URL": locals_server.url}
    done = subprocess.run([*RUNNERS[path.suffix], str(path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{name} failed:\n{done.stdout}\n{done.stderr}"
    CHECKS[name](done.stdout)
