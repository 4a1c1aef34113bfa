"""Applying a winning patch to the user's working tree so that a killed `locals run` leaves all
of it or none of it (a write-ahead journal, as databases do).

`git apply` writes file after file, each by deleting the old one and writing the new: a
`kill -9` in between leaves a file missing or cut short and the patch half applied. So the
new contents are built first, away from the user's files: the touched files go into a
scratch index beside the repository's own (the user's index is never written), `git apply
--cached` patches that index, and `git checkout-index` writes the results into a stage
folder in the git directory (same disk as the working tree: renames from it are atomic).
Once every staged file is flushed, a journal naming each rename and deletion is written
atomically (the commit point), then the renames run (microseconds a file) and the stage
goes. A kill before the journal leaves the tree as it was; a kill after it is finished by
`recover`, which the next run calls on opening the project, never undone halfway.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from pathlib import Path

import git
import psutil

from locals.errors import LocalsError

STAGES = "locals-apply"  # under the repository's git directory


class UnsafeApply(LocalsError):
    """A patch whose files cannot be put in place inside the project as they are now."""


def apply_whole(repo: git.Repo, patch_file: Path) -> None:
    """Apply `patch_file` (it passed `git apply --check`) to the working tree, all or nothing."""
    project = Path(repo.working_tree_dir)
    stage = Path(repo.git_dir) / STAGES / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    stage.mkdir(parents=True)
    if os.stat(stage).st_dev != os.stat(project).st_dev:  # a rename would copy: no atomicity to gain
        shutil.rmtree(stage)
        repo.git.apply("--binary", str(patch_file))
        return
    try:
        replace, delete = _staged_result(repo, patch_file, stage)
        _refuse_unsafe(project, stage, replace, delete)
    except git.GitCommandError as exc:  # git's own refusal (a path beyond a symlink, a file in a folder's place)
        _drop(stage)
        raise UnsafeApply(f"git cannot put the patch in place: {(exc.stderr or str(exc)).strip()}") from None
    except UnsafeApply:
        _drop(stage)
        raise
    for path in replace:
        _flush(stage / "files" / path)
    journal = {"pid": os.getpid(), "replace": replace, "delete": delete}
    _write_flushed(stage / "journal.tmp", json.dumps(journal).encode())
    os.replace(stage / "journal.tmp", stage / "journal.json")  # the commit point
    _finish(project, stage, journal)


def _staged_result(repo: git.Repo, patch_file: Path, stage: Path) -> tuple[list[str], list[str]]:
    """Write the patched files under `stage`/files; (paths written there, paths the patch deletes).

    The scratch index starts as a copy of the user's (its file stats spare hashing unchanged
    files), takes the working tree as it is (uncommitted and untracked files included), and
    is patched; the two trees before and after name what changed, renames as a deletion
    and an addition.
    """
    index = stage / "index"
    if Path(repo.index.path).exists():
        shutil.copyfile(repo.index.path, index)
    g, env = repo.git, {"GIT_INDEX_FILE": str(index)}
    g.add("-A", env=env)
    before = g.write_tree(env=env)
    g.apply("--cached", "--binary", str(patch_file), env=env)
    after = g.write_tree(env=env)
    fields = g.diff_tree("-r", "-z", "--no-renames", "--name-status", before, after,
                         strip_newline_in_stdout=False).split("\0")
    changes = list(zip(fields[0::2], fields[1::2]))
    replace = [path for status, path in changes if status != "D"]
    if replace:
        g.checkout_index(f"--prefix={stage / 'files'}/", "--", *replace, env=env)
    return replace, [path for status, path in changes if status == "D"]


def recover(repo: git.Repo) -> int:
    """Finish the applies a killed run cut short, drop the ones it had not started; how many."""
    stages = Path(repo.git_dir) / STAGES
    project, count = Path(repo.working_tree_dir), 0
    for stage in sorted(stages.iterdir()) if stages.is_dir() else []:
        if stage.name.endswith(".failed"):
            continue  # set aside for the user, said once
        pid = int(stage.name.split("-", 1)[0]) if stage.name.split("-", 1)[0].isdigit() else 0
        if pid != os.getpid() and psutil.pid_exists(pid):
            continue  # another run on this repository is applying right now
        try:
            journal = json.loads((stage / "journal.json").read_text())
        except (OSError, ValueError):
            _drop(stage)  # killed before its commit point: nothing was touched
        else:
            try:
                _finish(project, stage, journal)
            except OSError as exc:  # never again at every run: set aside, said once
                os.replace(stage, stage.with_name(stage.name + ".failed"))
                raise LocalsError(f"an interrupted apply in {project} could not be finished ({exc}); what it "
                                  f"staged is in {stage}.failed — look at it, then delete it") from exc
        count += 1
    return count


def _refuse_unsafe(project: Path, stage: Path, replace: list[str], delete: list[str]) -> None:
    """UnsafeApply, before the commit point, where a staged file could not land inside the project
    once the deletions are done: a symlink (or a file) on its way, a folder of the user's in its
    place, or something staged that is not a file (a nested repository)."""
    gone = set(delete)
    for path in replace:
        staged = stage / "files" / path
        if not (staged.is_symlink() or staged.is_file()):
            raise UnsafeApply(f"the patch adds {path!r}, which is not a file (a nested repository?)")
        parts = Path(path).parts
        for depth in range(1, len(parts)):
            on_way = "/".join(parts[:depth])
            if on_way in gone:
                continue  # the patch deletes it first, and a folder takes its place
            if (project / on_way).is_symlink() or (os.path.lexists(project / on_way)
                                                   and not (project / on_way).is_dir()):
                raise UnsafeApply(f"{on_way!r} in your project is a symlink or a file, where the patch "
                                  f"needs a folder for {path!r}")
        target = project / path
        if target.is_dir() and not target.is_symlink():
            left = [f for f in _files_under(target, project) if f not in gone]
            if left:
                raise UnsafeApply(f"your folder {path!r} stands where the patch writes a file ({left[0]!r} in it)")


def _files_under(folder: Path, project: Path) -> list[str]:
    return [(Path(root) / name).relative_to(project).as_posix()
            for root, _dirs, files in os.walk(folder) for name in files]


def _finish(project: Path, stage: Path, journal: dict) -> None:
    """Do the journal's deletions, then its renames (again: each is a no-op once done), then drop the
    stage. Deletions first, as git does: a symlink or a file the patch removes never stands on the
    way of a file it writes (a rename through a symlinked folder would land outside the project)."""
    for path in journal["delete"]:
        target = project / path
        if os.path.lexists(target):
            target.unlink()
        _remove_empty_folders(target.parent, project)
    for path in journal["replace"]:
        staged, target = stage / "files" / path, project / path
        if os.path.lexists(staged):
            _make_folders(target.parent, project)
            os.replace(staged, target)
    _drop(stage)


def _make_folders(folder: Path, top: Path) -> None:
    """`folder` and its missing parents under `top`, refusing to pass through a symlink."""
    for step in [*reversed(folder.relative_to(top).parents), folder.relative_to(top)][1:]:
        path = top / step
        if path.is_symlink():
            raise OSError(f"{step} is a symlink; a file would land outside the project")
        if not os.path.lexists(path):
            path.mkdir()


def _drop(stage: Path) -> None:
    shutil.rmtree(stage, ignore_errors=True)
    with contextlib.suppress(OSError):
        stage.parent.rmdir()  # the last apply leaves no folder in the git directory


def _write_flushed(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _flush(path: Path) -> None:
    if path.is_symlink() or not path.is_file():
        return
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _remove_empty_folders(folder: Path, top: Path) -> None:
    """Remove `folder` and its parents while empty, up to (not including) `top`, as `git apply` does."""
    while folder != top and top in folder.parents:
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent
