"""Putting a passing patch in place: never through a symlink out of the project, never over a
folder of the user's, folders and files trading places, and an unfinishable apply set aside."""

from __future__ import annotations

import json
import os
from pathlib import Path

import git
import pytest

from agents.patch_apply import STAGES, UnsafeApply, apply_whole, recover
from locals.errors import LocalsError
from tests.helpers.runner_project import git as run_git


def _project(tmp_path: Path, files: dict[str, str], links: dict[str, str] | None = None) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    run_git(project, "init", "-q")
    for name, text in files.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    for name, target in (links or {}).items():
        os.symlink(target, project / name)
    run_git(project, "add", "-A")
    run_git(project, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start")
    return project


def _patch_of(project: Path, tmp_path: Path, change) -> Path:
    """The patch of `change(copy)` made on a copy of the project, as an agent's worktree gives it."""
    copy = tmp_path / "copy"
    run_git(project, "worktree", "add", "-q", "--detach", str(copy))
    change(copy)
    run_git(copy, "add", "-A")
    patch = tmp_path / "change.patch"
    patch.write_text(run_git(copy, "diff", "--cached", "--binary", "--no-renames", "HEAD"))
    run_git(project, "worktree", "remove", "--force", str(copy))
    return patch


def test_a_symlink_the_patch_removes_never_carries_its_new_files_outside(tmp_path):
    outside = tmp_path / "home"
    outside.mkdir()
    project = _project(tmp_path, {"README.md": "x\n"}, links={"d": str(outside)})

    def symlink_to_folder(copy: Path):
        (copy / "d").unlink()
        (copy / "d").mkdir()
        (copy / "d" / ".bashrc").write_text("echo PWNED\n")

    apply_whole(git.Repo(project), _patch_of(project, tmp_path, symlink_to_folder))
    assert not (outside / ".bashrc").exists()
    assert not (project / "d").is_symlink() and (project / "d" / ".bashrc").read_text() == "echo PWNED\n"


def test_a_symlinked_folder_of_the_users_is_not_written_through(tmp_path):
    outside = tmp_path / "data"
    outside.mkdir()
    project = _project(tmp_path, {"README.md": "x\n"})
    patch = _patch_of(project, tmp_path, lambda copy: ((copy / "d").mkdir(), (copy / "d" / "x").write_text("x\n")))
    os.symlink(outside, project / "d")  # untracked, made since: git's own check does not look there
    with pytest.raises(UnsafeApply, match="beyond a symbolic link"):  # git's own check, before ours
        apply_whole(git.Repo(project), patch)
    assert not (outside / "x").exists() and not (Path(git.Repo(project).git_dir) / STAGES).exists()


@pytest.mark.parametrize("change, check", [
    (lambda c: (os.remove(c / "pkg" / "a.py"), os.rmdir(c / "pkg"), (c / "pkg").write_text("now a file\n")),
     lambda p: (p / "pkg").read_text() == "now a file\n"),
    (lambda c: (os.remove(c / "app.py"), (c / "app.py").mkdir(), (c / "app.py" / "main.py").write_text("m\n")),
     lambda p: (p / "app.py" / "main.py").read_text() == "m\n"),
])
def test_folders_and_files_trade_places(tmp_path, change, check):
    project = _project(tmp_path, {"pkg/a.py": "a\n", "app.py": "app\n"})
    apply_whole(git.Repo(project), _patch_of(project, tmp_path, change))
    assert check(project)


def test_a_folder_with_the_users_own_files_is_not_replaced(tmp_path):
    project = _project(tmp_path, {"pkg/a.py": "a\n"})
    patch = _patch_of(project, tmp_path,
                      lambda c: (os.remove(c / "pkg" / "a.py"), os.rmdir(c / "pkg"), (c / "pkg").write_text("f\n")))
    (project / "pkg" / "mine.txt").write_text("untracked, the user's\n")
    with pytest.raises(UnsafeApply, match="'pkg' appears as both a file and as a directory"):
        apply_whole(git.Repo(project), patch)
    assert (project / "pkg" / "mine.txt").exists() and (project / "pkg" / "a.py").exists()


def test_an_apply_that_cannot_be_finished_is_set_aside_once(tmp_path):
    project = _project(tmp_path, {"README.md": "x\n"})
    stage = Path(git.Repo(project).git_dir) / STAGES / "4194305-dead"
    (stage / "files").mkdir(parents=True)
    (stage / "files" / "f").write_text("new\n")
    (project / "f").mkdir()  # a folder now stands where the journal renames a file
    (project / "f" / "keep").write_text("k\n")
    (stage / "journal.json").write_text(json.dumps({"pid": 4194305, "replace": ["f"], "delete": []}))
    with pytest.raises(LocalsError, match="could not be finished"):
        recover(git.Repo(project))
    assert recover(git.Repo(project)) == 0  # the next run goes on
    assert (project / "f" / "keep").exists() and stage.with_name("4194305-dead.failed").is_dir()


def test_a_nested_repository_in_the_patch_is_refused_before_any_write(tmp_path):
    project = _project(tmp_path, {"README.md": "x\n"})

    def nested_repo(copy: Path):
        run_git(copy, "init", "-q", "vendor")
        run_git(copy / "vendor", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x")
        (copy / "new.txt").write_text("n\n")

    with pytest.raises(UnsafeApply, match="'vendor', which is not a file"):
        apply_whole(git.Repo(project), _patch_of(project, tmp_path, nested_repo))
    assert not (project / "new.txt").exists() and not (Path(git.Repo(project).git_dir) / STAGES).exists()
