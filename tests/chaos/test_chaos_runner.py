"""`kill -9` of `locals run` (a real process, driven by the scripted OpenAI endpoint): during a
run the project is left exactly as it was, uncommitted and untracked files included, and
the next run removes the killed runs' worktrees; during the apply it holds the whole patch
or none of it (a kill inside the journal's renames is finished by the next run's start).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import git
import pytest

from agents.patch_apply import STAGES, apply_whole, recover
from agents.runner import RunOptions, run_team
from locals.client import ChatClient

from tests.helpers.fake_openai import FakeOpenAI, call, calls
from tests.helpers.runner_project import CHECK, GOOD_CODE, TASK, TESTS, coder, make_project, one_part_plan, turn, worktrees

KILL_ROUNDS = 8
GENERATED = 300  # files the winning patch adds, so that its apply takes a while


def project_state(project: Path) -> dict:
    """Everything a user could see of the project: files (content and mode), git's view of them."""
    files = {str(p.relative_to(project)): (p.read_bytes(), p.stat().st_mode & 0o777) for p in _work_files(project)}
    g = git.Repo(project).git
    return {"files": files, "status": g.status("--porcelain", "--untracked-files=all"),
            "staged": g.diff("--cached", "--name-status"), "tree": g.rev_parse("HEAD^{tree}"),
            "branches": g.branch("--list", "--all")}


def _work_files(project: Path) -> list[Path]:
    """The project's files outside .git, which is never walked: a killed run's orphaned git
    child may still be pruning .git/worktrees while the state is read."""
    found = []
    for folder, dirs, names in os.walk(project):
        dirs[:] = sorted(d for d in dirs if d != ".git")
        found += [Path(folder, n) for n in names if Path(folder, n).is_file()]
    return sorted(found)


def start_run(project: Path, url: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "locals", "run", TASK, "--dir", str(project), "--check", CHECK, "--server", url,
         "--no-sandbox", "--json", *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def generating_coder(body: dict) -> dict:
    """One agent that writes the solution and GENERATED more files with one command."""
    if body.get("response_format"):
        return one_part_plan(body)
    script = ("import pathlib; [pathlib.Path('gen', f'f{i}.txt').write_text(str(i) * 4000) "
              f"for i in range({GENERATED})]")
    steps = [calls(call("write_file", path="wordcount.py", content=GOOD_CODE)),
             calls(call("write_file", path="test_wordcount.py", content=TESTS)),
             calls(call("run", command=f"mkdir -p gen && {sys.executable} -c \"{script}\"")),
             calls(call("finish", summary="done"))]
    return steps[min(turn(body), len(steps) - 1)]


@pytest.mark.slow
def test_kill_9_during_runs_leaves_the_project_and_the_next_run_cleans_up(tmp_path, locals_home):
    project = make_project(tmp_path)
    before = project_state(project)
    rng = random.Random(36)
    stray = 0
    with FakeOpenAI(coder(good_agents=set()), delay_s=0.3).in_thread() as url:  # nobody passes: no apply
        for _ in range(KILL_ROUNDS):
            run = start_run(project, url, "--agents", "2", "--parts", "1")
            time.sleep(rng.uniform(0.5, 6.0))
            run.send_signal(signal.SIGKILL)
            run.wait(timeout=30)
            assert project_state(project) == before, "a killed run changed the project"
            stray = max(stray, len(worktrees(project)) - 1)
    with FakeOpenAI(coder(good_agents={0})).in_thread() as url:
        finished = start_run(project, url, "--agents", "1", "--parts", "1")
        assert finished.wait(timeout=300) == 0, finished.stderr.read()[-3000:]
    assert len(worktrees(project)) == 1, "the next run left the killed runs' worktrees"
    assert not list((locals_home / "state" / "runs").iterdir())
    assert (project / "wordcount.py").read_text() == GOOD_CODE
    assert (project / "notes.txt").read_text() == "first line\nuncommitted line\n"
    assert stray, "no kill landed while worktrees existed"
    print(f"\nrunner: {KILL_ROUNDS} kills during runs survived, up to {stray} stray worktrees "
          "cleaned by the next run")


@pytest.mark.slow
def test_kill_9_during_the_apply_leaves_all_of_the_patch_or_none(tmp_path):
    rng = random.Random(36)
    outcomes = {"none": 0, "whole": 0, "finished by the next run": 0}
    after = None
    with FakeOpenAI(generating_coder).in_thread() as url:
        for round_no in range(KILL_ROUNDS + 1):
            (tmp_path / f"round{round_no}").mkdir()
            project = make_project(tmp_path / f"round{round_no}")
            before = project_state(project)
            run = start_run(project, url, "--agents", "1", "--parts", "1")
            if round_no == 0:  # a run left alone: what the whole patch looks like, how long it takes
                applying_s = _apply_time(run, project)
                assert run.wait(timeout=300) == 0, run.stderr.read()[-3000:]
                after = project_state(project)
                continue
            _wait_for_apply(run, project)
            time.sleep(rng.uniform(0, 1.2 * applying_s))
            run.send_signal(signal.SIGKILL)
            run.wait(timeout=30)
            state, journal = project_state(project), any((Path(project, ".git", STAGES)).glob("*/journal.json"))
            recover(git.Repo(project))  # what the next run does first
            recovered = project_state(project)
            assert recovered in (before, after), f"round {round_no}: the apply was left half done"
            outcome = "none" if recovered == before else "finished by the next run" if journal else "whole"
            assert state == recovered or journal, f"round {round_no}: half applied with no journal"
            outcomes[outcome] += 1
    print(f"\nrunner: {KILL_ROUNDS} kills around the apply (it takes {applying_s:.2f} s): {outcomes}")
    assert len(after["files"]) == len(before["files"]) + 2 + GENERATED


def _applying(project: Path) -> bool:
    stages = project / ".git" / STAGES
    return stages.is_dir() and any(stages.iterdir())


def _wait_for_apply(run: subprocess.Popen, project: Path) -> None:
    """Until the run's apply starts (its stage appears in .git) or the run ends."""
    deadline = time.monotonic() + 300
    while run.poll() is None and time.monotonic() < deadline and not _applying(project):
        time.sleep(0.002)


def _apply_time(run: subprocess.Popen, project: Path) -> float:
    """Seconds the run's apply took, stage to no stage."""
    _wait_for_apply(run, project)
    started = time.monotonic()
    while _applying(project):
        time.sleep(0.002)
    return time.monotonic() - started


def test_a_kill_between_the_renames_is_finished_by_the_next_run(tmp_path):
    """The one moment a kill leaves a patch half applied, made certain: the process dies after
    its second rename into the project; the next run's first step completes the patch."""
    project = make_project(tmp_path)
    patch = tmp_path / "winner.patch"
    patch.write_text(_patch_adding(project, {f"file{i}.txt": f"content {i}\n" for i in range(5)}))
    dying = textwrap.dedent(f"""
        import os, signal, sys
        from pathlib import Path
        import git
        from agents import patch_apply
        real, renamed = os.replace, []
        def replace(src, dst):
            real(src, dst)
            if ".git" not in Path(dst).parts:
                renamed.append(dst)
                if len(renamed) == 2:
                    os.kill(os.getpid(), signal.SIGKILL)
        os.replace = replace
        patch_apply.apply_whole(git.Repo({str(project)!r}), Path({str(patch)!r}))
    """)
    died = subprocess.run([sys.executable, "-c", dying], cwd=Path(__file__).parents[2])
    assert died.returncode == -signal.SIGKILL
    assert sum((project / f"file{i}.txt").exists() for i in range(5)) == 2  # half, for now
    run_a_question(project)  # any next run on the project
    assert [(project / f"file{i}.txt").read_text() for i in range(5)] == [f"content {i}\n" for i in range(5)]
    assert (project / "notes.txt").read_text() == "first line\nuncommitted line\n"
    assert not (project / ".git" / STAGES).exists()


def test_a_kill_before_the_journal_leaves_nothing_to_do(tmp_path):
    project = make_project(tmp_path)
    before = project_state(project)
    stage = project / ".git" / STAGES / "999999999-deadbeef"  # a dead run's half-built stage
    (stage / "files").mkdir(parents=True)
    (stage / "files" / "notes.txt").write_text("half written")
    assert recover(git.Repo(project)) == 1
    assert project_state(project) == before and not (project / ".git" / STAGES).exists()


def test_apply_whole_matches_git_apply(tmp_path):
    """Renames, deletions (with their emptied folders), modes and binary files, as `git apply`."""
    (tmp_path / "a").mkdir()
    project = make_project(tmp_path / "a")
    (project / "sub" / "deep").mkdir(parents=True)
    (project / "sub" / "deep" / "gone.txt").write_text("gone\n")
    (project / "run.sh").write_text("echo\n")
    (project / "blob.bin").write_bytes(b"\x00\x01")
    g = git.Repo(project).git
    g.add("-A")
    g.commit("-qm", "more", author="t <t@t>", env={"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})
    (project / "notes.txt").write_text("first line\nuncommitted line\n")
    twin = tmp_path / "b"
    subprocess.run(["cp", "-a", str(project), str(twin)], check=True)
    edit = textwrap.dedent("""
        git add -A && base=$(git write-tree)
        echo more >> notes.txt && git rm -q sub/deep/gone.txt && mkdir new && git mv README.md new/README.md
        chmod +x run.sh && printf '\\002\\003' > blob.bin && git add -A && git diff --cached --binary $base
    """)
    work = tmp_path / "c"
    subprocess.run(["cp", "-a", str(project), str(work)], check=True)
    patch = tmp_path / "p.patch"
    patch.write_text(subprocess.run(["sh", "-c", edit], cwd=work, check=True, capture_output=True, text=True).stdout)
    apply_whole(git.Repo(project), patch)
    subprocess.run(["git", "apply", "--binary", str(patch)], cwd=twin, check=True)
    assert project_state(project)["files"] == project_state(twin)["files"]
    assert not (project / "sub").exists() and os.access(project / "run.sh", os.X_OK)


def _patch_adding(project: Path, files: dict[str, str]) -> str:
    body = []
    for name, content in files.items():
        lines = content.splitlines()
        body.append(f"diff --git a/{name} b/{name}\nnew file mode 100644\n--- /dev/null\n+++ b/{name}\n"
                    f"@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{line}\n" for line in lines))
    return "".join(body)


def run_a_question(project: Path) -> None:
    """A question-mode run on `project` (its first step recovers a cut-short apply)."""
    import asyncio

    async def ask():
        fake = FakeOpenAI(lambda body: calls(call("finish", summary="an answer")))
        async with fake as url, ChatClient(url) as client:
            await run_team(RunOptions(task="what is here?", directory=project, agents=1, max_steps=2,
                                      sandbox=False), client)

    asyncio.run(ask())
