"""`locals run` end to end on the real daemon and the embedded model: the README example and
question mode. The tiny model may fail the task; the run must then say so and leave the
project as it was, and never apply a patch that fails the check.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

TASK = "write wordcount.py with a function count_words(text) and tests in test_wordcount.py"
BOUNDS = ["--max-steps", "3", "--max-tokens", "192", "--timeout", "480"]


def git(cwd, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def project(tmp_path):
    path = tmp_path / "my-project"
    path.mkdir()
    git(path, "init", "-q")
    (path / "README.md").write_text("# my project\n\nNotes are kept in notes.txt.\n")
    git(path, "add", "-A")
    git(path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start")
    (path / "notes.txt").write_text("uncommitted notes\n")
    return path


def test_readme_example_on_the_embedded_model(locals_server, project):
    done = locals_server.cli("run", TASK, "--dir", str(project), "--check", "python3 -m pytest -q",
                             "--port", str(locals_server.port), "--agents", "2", *BOUNDS, "--json")
    assert done.returncode in (0, 1), done.stderr
    report = json.loads(done.stdout)
    assert report["prompt_tokens"] > 0 and report["completion_tokens"] > 0  # the agents really talked
    assert (project / "notes.txt").read_text() == "uncommitted notes\n"
    assert git(project, "worktree", "list").count("\n") == 1
    if report["ok"]:
        assert done.returncode == 0 and report["parts"][0]["status"] == "applied"
        check = subprocess.run([sys.executable, "-m", "pytest", "-q"], cwd=project, capture_output=True, text=True)
        assert check.returncode == 0, check.stdout  # an applied patch passes the check in the project too
    else:
        assert done.returncode == 1 and report["message"]
        assert git(project, "status", "--porcelain") == "?? notes.txt\n"


def test_question_mode_on_the_embedded_model(locals_server, project):
    done = locals_server.cli("run", "What is this project about?", "--dir", str(project),
                             "--port", str(locals_server.port), "--agents", "1", *BOUNDS)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
    assert git(project, "status", "--porcelain") == "?? notes.txt\n"
