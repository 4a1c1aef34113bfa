"""Git side of a run: detached worktrees that start from the user's current state (uncommitted
and untracked files included), the patch of an agent's work, and applying it to the user's tree.

Worktrees live under the state dir, never inside the project. The user's working tree is
written only by `apply_patch`, after `git apply --check` has passed, and all at once
(patch_apply.py): a killed run leaves the whole patch or none of it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import git
import psutil

from agents.patch_apply import UnsafeApply, apply_whole
from locals import settings
from locals.config import state_dir
from locals.errors import LocalsError

# Caches that commands in a worktree create must never reach the user's project.
_EXCLUDES = "__pycache__/\n*.py[cod]\n.pytest_cache/\n.mypy_cache/\n.ruff_cache/\n.DS_Store\n"
# A patch as `git apply` reads it whatever the user's config says (color.ui, diff.noprefix,
# diff.mnemonicPrefix, an external diff tool or text conversions would each break it); a rename
# as a deletion and an addition, so both paths are named where the patch is listed.
_PATCH = ("--binary", "--no-color", "--no-ext-diff", "--no-textconv", "--no-renames", "--src-prefix=a/",
          "--dst-prefix=b/")


_CACHE_PATH = re.compile(r"(^|/)(__pycache__|\.pytest_cache|\.mypy_cache|\.ruff_cache)/|\.py[cod]$|(^|/)\.DS_Store$")


class ProjectError(LocalsError):
    """The --dir folder cannot host worktrees (not a git repository, no commit yet)."""


def open_project(directory: Path) -> git.Repo:
    """The git repository at `directory` (its top level), with advice when it is not one."""
    try:
        repo = git.Repo(directory, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise ProjectError(
            f"{directory} is not a git repository; agents work in git worktrees: run "
            f"`git init && git add -A && git commit -m start` there first"
        ) from None
    if repo.bare:
        raise ProjectError(f"{directory} is a bare repository; pass a folder with a working tree")
    try:
        repo.head.commit
    except ValueError:
        raise ProjectError(f"{directory} has no commit yet; run `git add -A && git commit -m start` there first") from None
    top = Path(repo.working_tree_dir).resolve()
    if Path(directory).resolve() != top:  # agents and the check work from the top: say so, never guess
        raise ProjectError(f"{directory} is inside the repository {top}; the agents work on the whole repository "
                           f"and --check runs at its top: pass --dir {top} (and name paths from there)")
    return repo


@dataclass
class Snapshot:
    """The user's uncommitted state, captured once per part: a patch against HEAD and untracked files."""

    head: str
    patch_file: Path | None
    untracked: list[str]


class RunArea:
    """One run's folder under the state dir: worktrees, the snapshot, kept patches; removed at the end."""

    def __init__(self, repo: git.Repo, root: Path | None = None):
        self.repo = repo
        self.project = Path(repo.working_tree_dir)
        self.path = (root or state_dir() / "runs") / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.path.mkdir(parents=True)
        self._owner = {"pid": os.getpid(), "project": str(self.project)}
        (self.path / "owner.json").write_text(json.dumps(self._owner))
        self.excludes = self.path / "excludes"
        # core.excludesFile replaces the user's global excludes: carry them over, then ours.
        self.excludes.write_text(_user_excludes(repo) + "\n" + _EXCLUDES)
        self.worktrees: list[Path] = []
        self._git_dirs: dict[Path, str] = {}  # each worktree's git folder, read before any agent ran

    def mark_kept(self) -> None:
        """Leave this run's folder for the user (`--keep`): later runs' cleanup skips it."""
        (self.path / "owner.json").write_text(json.dumps({**self._owner, "kept": True}))

    def git(self, cwd: Path) -> git.Git:
        """A git command runner in `cwd` that ignores build caches on top of the user's excludes.

        In a worktree it names the worktree's git folder itself: an agent may rewrite the
        worktree's `.git` file (to a repository whose config runs its own programs: core.fsmonitor,
        diff.external), and these commands run outside the sandbox."""
        runner = git.Git(str(cwd))
        config = {"core.excludesFile": str(self.excludes), "core.fsmonitor": "false", "core.hooksPath": os.devnull}
        env = {"GIT_CONFIG_COUNT": str(len(config))}
        for i, (key, value) in enumerate(config.items()):
            env |= {f"GIT_CONFIG_KEY_{i}": key, f"GIT_CONFIG_VALUE_{i}": value}
        if cwd in self._git_dirs:
            env |= {"GIT_DIR": self._git_dirs[cwd], "GIT_WORK_TREE": str(cwd)}
        runner.update_environment(**env)
        return runner

    def snapshot(self, label: str) -> Snapshot:
        """The user's current uncommitted and untracked state."""
        g = self.repo.git
        patch = g.diff("HEAD", *_PATCH, "--ignore-submodules", stdout_as_string=False)
        patch_file = None
        if patch.strip():
            patch_file = self.path / f"{label}-user.patch"
            patch_file.write_bytes(patch if patch.endswith(b"\n") else patch + b"\n")
        untracked = [p for p in g.ls_files("--others", "--exclude-standard", "-z").split("\0") if p]
        return Snapshot(head=self.repo.head.commit.hexsha, patch_file=patch_file, untracked=untracked)

    def add_worktree(self, name: str, snap: Snapshot) -> tuple[Path, str]:
        """A detached worktree holding the snapshot; returns its path and the baseline tree id."""
        path = self.path / name
        self.worktrees.append(path)
        self.repo.git.worktree("add", "--detach", "--quiet", str(path), snap.head)
        self._git_dirs[path] = _git_dir_of(path)
        wt = self.git(path)
        if snap.patch_file is not None:
            wt.apply("--binary", "--whitespace=nowarn", str(snap.patch_file))
        for rel in snap.untracked:
            src, dst = self.project / rel, path / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_symlink() or src.is_file():
                shutil.copy2(src, dst, follow_symlinks=False)
        wt.add("-A")
        return path, wt.write_tree()

    def diff(self, worktree: Path, baseline: str) -> str:
        """The agent's changes since the baseline tree, as a binary-safe patch (empty if none)."""
        wt = self.git(worktree)
        wt.add("-A")
        return wt.diff("--cached", *_PATCH, baseline, stdout_as_string=True, strip_newline_in_stdout=False)

    def restore(self, worktree: Path, baseline: str, patch: str) -> None:
        """Put the worktree back to the baseline plus `patch` (what a check ran on): files the check
        wrote (a report, coverage data) must not join a later patch."""
        if self.diff(worktree, baseline) == patch:
            return
        wt = self.git(worktree)
        wt.read_tree("--reset", "-u", baseline)
        wt.clean("-fdq")  # untracked files the check made; ignored ones (caches) stay
        if patch:
            patch_file = self.path / f"{worktree.name}-checked.patch"
            patch_file.write_text(patch, errors="surrogateescape")
            wt.apply("--binary", "--whitespace=nowarn", str(patch_file))
        wt.add("-A")

    @staticmethod
    def clear_bytecode(worktree: Path) -> None:
        """Remove Python's bytecode caches before a check: commands run without writing them
        (PYTHONDONTWRITEBYTECODE), and ones an agent wrote itself, which no patch carries, could
        make code that is not in its patch pass."""
        for folder, dirs, files in os.walk(worktree):
            dirs[:] = [d for d in dirs if d != ".git"]
            for name in [d for d in dirs if d == "__pycache__"]:
                shutil.rmtree(Path(folder) / name, ignore_errors=True)
                dirs.remove(name)
            for name in files:
                if name.endswith((".pyc", ".pyo")):
                    (Path(folder) / name).unlink(missing_ok=True)

    def unpatched_files(self, worktree: Path) -> list[str]:
        """Files in the worktree that ignore rules keep out of its patch (build caches aside): a check
        that passes beside them may not pass on the user's tree, so the runner says so."""
        listed = self.git(worktree).ls_files("--others", "--ignored", "--exclude-standard", "-z").split("\0")
        return [path for path in listed if path and not _CACHE_PATH.search(path)]

    def changed_files(self, patch_file: Path) -> tuple[list[str], list[str]]:
        """The paths a patch touches, as git reads them ("added\tdeleted\tpath" a file), and those
        it creates."""
        stats = self.repo.git.apply("--numstat", "-z", str(patch_file)).split("\0")
        created = re.findall(r"^ create mode \d+ (.+)$", self.repo.git.apply("--summary", str(patch_file)), re.M)
        return [stat.split("\t", 2)[2] for stat in stats if stat.count("\t") >= 2], created

    def keep_patch(self, patch: str, label: str) -> Path:
        """Save a patch outside the run folder (it survives cleanup) and return its path."""
        folder = state_dir() / "patches"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.path.name}-{label}.patch"
        path.write_text(patch, errors="surrogateescape")  # a non-UTF-8 file's bytes, as git gave them
        return path

    def remove_worktree(self, path: Path) -> None:
        try:
            self.repo.git.worktree("remove", "--force", str(path))
        except git.GitCommandError:
            pass  # already gone or half-made: rmtree and prune below finish the job
        shutil.rmtree(path, ignore_errors=True)

    def cleanup(self) -> None:
        """Remove every worktree of this run and the run folder; prune git's bookkeeping."""
        for path in self.worktrees:
            self.remove_worktree(path)
        shutil.rmtree(self.path, ignore_errors=True)
        _prune(self.repo)


@dataclass
class ApplyResult:
    applied: bool
    files: list[str]
    kept_at: Path | None = None
    error: str = ""
    refused: bool = False  # unsafe to put in place (UnsafeApply), not a conflict with the user's edits
    notes: list[str] = field(default_factory=list)  # review_notes


def apply_patch(area: RunArea, patch: str, label: str) -> ApplyResult:
    """Apply `patch` to the user's working tree if it applies cleanly; else keep it as a file."""
    patch_file = area.path / f"{label}-winner.patch"
    patch_file.write_text(patch, errors="surrogateescape")
    files, created = area.changed_files(patch_file)
    g = area.repo.git
    try:
        g.apply("--check", "--binary", str(patch_file))
    except git.GitCommandError as exc:
        kept = area.keep_patch(patch, label)
        return ApplyResult(False, files, kept_at=kept, error=(exc.stderr or str(exc)).strip())
    try:
        apply_whole(area.repo, patch_file)
    except UnsafeApply as exc:  # refused before any file of the user's was touched
        return ApplyResult(False, files, kept_at=area.keep_patch(patch, label), error=str(exc), refused=True)
    return ApplyResult(True, files, notes=review_notes(files, created))


_TEST_PATH = re.compile(r"(^|/)(tests?/|__tests__/|spec/|test_[^/]*$|conftest\.py$|[^/]*_(test|spec)\.\w+$"
                        r"|[^/]*\.(spec|test)\.\w+$)")


def review_notes(files: list[str], created: list[str]) -> list[str]:
    """What in an applied patch deserves a second look: tests that were there before and that it
    changes or deletes (a check passed by rewriting its tests), `.gitattributes` (it changes how
    git writes files), and what looks like a git folder (git run inside it would obey its config)."""
    notes = []
    tests = [f for f in files if _TEST_PATH.search(f) and f not in created]
    if tests:
        notes.append(f"it changes tests that were there before ({', '.join(tests)})")
    if any(f == ".gitattributes" or f.endswith("/.gitattributes") for f in files):
        notes.append("it changes .gitattributes")
    folders = {f.rsplit("/", 1)[0] if "/" in f else "." for f in files if f.endswith(("/HEAD", "/config"))}
    repos = sorted(d for d in folders if f"{d}/HEAD" in files and f"{d}/config" in files)
    if repos:
        notes.append(f"it adds what looks like a git folder ({', '.join(repos)}/): git run there obeys its config")
    return notes


def _git_dir_of(worktree: Path) -> str:
    """The git folder a new worktree's `.git` file names."""
    pointer = (worktree / ".git").read_text().strip()
    if not pointer.startswith("gitdir:"):
        raise LocalsError(f"{worktree}: git made no worktree pointer there ({pointer[:80]!r})")
    return str((worktree / pointer.removeprefix("gitdir:").strip()).resolve())


def clean_stale_runs(root: Path | None = None) -> int:
    """Remove run folders left by runs whose process died (kill -9, power loss); returns how many."""
    runs = root or state_dir() / "runs"
    removed = 0
    for folder in runs.glob("*") if runs.is_dir() else []:
        try:
            owner = json.loads((folder / "owner.json").read_text())
        except (OSError, ValueError):
            continue
        if owner.get("kept") or psutil.pid_exists(int(owner.get("pid", 0))):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        try:
            _prune(git.Repo(owner["project"]))
        except (git.GitError, KeyError, OSError):
            pass
        removed += 1
    return removed


def _user_excludes(repo: git.Repo) -> str:
    """The text of the user's global excludes file (core.excludesFile, else git's XDG default), or ""."""
    try:
        path = Path(repo.git.config("--get", "core.excludesFile")).expanduser()
    except git.GitCommandError:
        path = Path(settings.foreign("XDG_CONFIG_HOME") or Path.home() / ".config") / "git" / "ignore"
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return ""


def _prune(repo: git.Repo) -> None:
    try:
        repo.git.worktree("prune")
    except git.GitCommandError:
        pass


def project_listing(repo: git.Repo, limit: int = 80) -> str:
    """The project's files (tracked and untracked, ignored ones left out) for the agents' first prompt."""
    names = [n for n in repo.git.ls_files("--cached", "--others", "--exclude-standard").splitlines() if n]
    shown = names[:limit]
    if len(names) > limit:
        shown.append(f"... and {len(names) - limit} more (use list_files)")
    return "\n".join(shown) or "(no files yet)"
