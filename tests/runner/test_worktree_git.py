"""The git side of a run outside the sandbox: what an agent's worktree can make it run, the user's
git config, files a check leaves behind, and the paths a patch touches."""

from __future__ import annotations

import stat

import pytest

from agents.worktree import RunArea, apply_patch, open_project
from tests.helpers.runner_project import git, make_project


@pytest.fixture
def area(tmp_path):
    run_area = RunArea(open_project(make_project(tmp_path)), root=tmp_path / "runs")
    yield run_area
    run_area.cleanup()


def _worktree(area: RunArea):
    return area.add_worktree("p1-a1", area.snapshot("p1"))


def test_a_rewritten_dot_git_runs_nothing_of_the_agents_outside_the_sandbox(area, tmp_path):
    worktree, baseline = _worktree(area)
    marker = tmp_path / "ran"
    hook = worktree / "hook.sh"
    hook.write_text(f"#!/bin/sh\ntouch {marker}\n")
    hook.chmod(hook.stat().st_mode | stat.S_IXUSR)
    # What an agent's `run` command can do in its own worktree: a repository of its own whose
    # config names programs git runs, and the worktree's .git pointing at it.
    git(worktree, "init", "-q", "evil")
    git(worktree / "evil", "-c", "user.name=a", "-c", "user.email=a@a", "commit", "-q", "--allow-empty", "-m", "x")
    git(worktree / "evil", "config", "core.fsmonitor", str(hook))
    git(worktree / "evil", "config", "diff.external", str(hook))
    (worktree / ".git").write_text("gitdir: evil/.git\n")
    (worktree / "notes.txt").write_text("changed by the agent\n")

    patch = area.diff(worktree, baseline)
    assert not marker.exists()
    assert "+changed by the agent" in patch and "notes.txt" in area.changed_files(_saved(area, patch))[0]


def test_the_users_diff_settings_do_not_change_the_patch(area, tmp_path, monkeypatch):
    config = tmp_path / "gitconfig"
    config.write_text("[diff]\n\tnoprefix = true\n\tmnemonicPrefix = true\n\texternal = false\n"
                      "[color]\n\tui = always\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    worktree, baseline = _worktree(area)  # the user's uncommitted edit travels as a patch too
    (worktree / "new file b/x.py").parent.mkdir()
    (worktree / "new file b/x.py").write_text("x = 1\n")
    (worktree / "README.md").rename(worktree / "README.txt")

    patch = area.diff(worktree, baseline)
    assert "\x1b[" not in patch and "diff --git a/" in patch
    result = apply_patch(area, patch, "p1")
    assert result.applied, result.error
    assert sorted(result.files) == ["README.md", "README.txt", "new file b/x.py"]  # both sides of a rename
    assert (area.project / "new file b" / "x.py").read_text() == "x = 1\n"
    assert (area.project / "notes.txt").read_text() == "first line\nuncommitted line\n"


def test_what_a_check_writes_never_joins_the_patch(area):
    worktree, baseline = _worktree(area)
    (worktree / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    checked = area.diff(worktree, baseline)
    (worktree / "report.xml").write_text("<testsuite/>")  # the check's own output
    (worktree / "notes.txt").write_text("rewritten by the check\n")
    area.restore(worktree, baseline, checked)
    assert not (worktree / "report.xml").exists()
    assert (worktree / "notes.txt").read_text() == "first line\nuncommitted line\n"
    assert area.diff(worktree, baseline) == checked


def _saved(area: RunArea, patch: str):
    path = area.path / "test.patch"
    path.write_text(patch)
    return path


def test_what_deserves_a_second_look_is_pointed_out():
    from agents.worktree import review_notes

    files = ["tests/test_calc.py", "calc_test.go", "calc.py", "web/app.spec.ts", "docs/.gitattributes",
             "vendor/x/HEAD", "vendor/x/config", "vendor/x/objects/.keep"]
    notes = review_notes(files, created=["calc_test.go", "vendor/x/HEAD", "vendor/x/config"])
    assert notes == ["it changes tests that were there before (tests/test_calc.py, web/app.spec.ts)",
                     "it changes .gitattributes",
                     "it adds what looks like a git folder (vendor/x/): git run there obeys its config"]
    assert review_notes(["calc.py", "test_new.py"], created=["test_new.py"]) == []  # a new test is no concern


def test_bytecode_an_agent_left_is_gone_before_a_check(area):
    worktree, _ = _worktree(area)
    (worktree / "pkg" / "__pycache__").mkdir(parents=True)
    (worktree / "pkg" / "__pycache__" / "app.cpython-311.pyc").write_bytes(b"compiled from code not in the patch")
    (worktree / "old.pyc").write_bytes(b"x")
    (worktree / "app.py").write_text("x = 1\n")
    area.clear_bytecode(worktree)
    assert not (worktree / "pkg" / "__pycache__").exists() and not (worktree / "old.pyc").exists()
    assert (worktree / "app.py").exists() and (worktree / ".git").exists()


def test_files_ignore_rules_keep_out_of_the_patch_are_named(area):
    worktree, baseline = _worktree(area)
    (worktree / "calc").mkdir()
    (worktree / "calc" / ".gitignore").write_text("*\n")  # it ignores itself too: no patch shows it
    (worktree / "calc" / "__init__.py").write_text("def add(a, b):\n    return a + b\n")
    (worktree / "__pycache__").mkdir()
    (worktree / "__pycache__" / "x.pyc").write_bytes(b"a cache, not worth a note")
    (worktree / "README.md").write_text("changed\n")
    assert "calc/" not in area.diff(worktree, baseline)
    assert sorted(area.unpatched_files(worktree)) == ["calc/.gitignore", "calc/__init__.py"]


async def test_a_change_git_cannot_take_is_the_agents_to_fix(area):
    from agents.check import Checker
    from agents.sandbox import Sandbox

    worktree, baseline = _worktree(area)
    git(worktree, "init", "-q", "nested")  # a repository with no commit: `git add` refuses it
    verdict = await Checker(area, "true").check(worktree, baseline, Sandbox([worktree], kind="none"))
    assert not verdict.passed and "git cannot take your changes" in verdict.output and "nested" in verdict.output
