"""Shared pieces of the runner tests: a scratch git project and scripted agents."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers.fake_openai import call, calls, text, turn


CHECK = f"{sys.executable} -m pytest -q -p no:cacheprovider"
TASK = "write wordcount.py with a function count_words(text) and tests in test_wordcount.py"

GOOD_CODE = "def count_words(text):\n    return len(text.split())\n"
BAD_CODE = "def count_words(text):\n    return 0\n"
TESTS = (
    "from wordcount import count_words\n\n\n"
    "def test_count_words():\n    assert count_words('a b  c') == 3\n    assert count_words('') == 0\n"
)


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def make_project(root: Path) -> Path:
    """A committed repo with a tracked file edited but not committed, and an untracked file."""
    project = root / "project"
    project.mkdir()
    git(project, "init", "-q")
    (project / "README.md").write_text("# demo\n")
    (project / "notes.txt").write_text("first line\n")
    git(project, "add", "-A")
    git(project, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start")
    (project / "notes.txt").write_text("first line\nuncommitted line\n")
    (project / "scratch.txt").write_text("untracked\n")
    return project


def agent_index(body: dict[str, Any]) -> int:
    """Which agent sent the request, from its temperature (see agents.agent.sampling_for)."""
    return round((body["temperature"] - 0.2) / 0.25)


def one_part_plan(body: dict[str, Any]) -> dict[str, Any]:
    return text(json.dumps({"parts": [{"goal": TASK, "files": ["wordcount.py", "test_wordcount.py"], "depends_on": []}]}))


def coder(good_agents: set[int]):
    """Agents in `good_agents` write a correct solution; the others a wrong one, then keep finishing."""

    def script(body: dict[str, Any]) -> dict[str, Any]:
        if body.get("response_format"):
            return one_part_plan(body)
        code = GOOD_CODE if agent_index(body) in good_agents else BAD_CODE
        steps = [
            calls(call("list_files", path=".")),
            calls(call("write_file", path="wordcount.py", content=code)),
            calls(call("write_file", path="test_wordcount.py", content=TESTS)),
            calls(call("finish", summary="wrote wordcount.py and its tests")),
        ]
        return steps[min(turn(body), len(steps) - 1)]

    return script


def worktrees(project: Path) -> list[str]:
    return [line for line in git(project, "worktree", "list", "--porcelain").splitlines() if line.startswith("worktree ")]


def tool_results(fake) -> list[str]:
    """Every tool result the agents were shown, in order."""
    seen: list[str] = []
    for body in fake.requests:
        for m in body.get("messages", []):
            if m.get("role") == "tool" and m["content"] not in seen:
                seen.append(m["content"])
    return seen
