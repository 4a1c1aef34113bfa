"""A `--check` that hangs, floods its output or forks a daemon is bounded: the run ends in
about the check's time limit (or at once), its output costs a fixed amount of memory, and
no process it started is left running.
"""

from __future__ import annotations

import sys
import time
import uuid

import psutil
import pytest

from agents.command_bounds import BoundedOutput
from agents.runner import RunOptions, run_team
from locals.client import ChatClient

from tests.helpers.fake_openai import FakeOpenAI
from tests.helpers.runner_project import TASK, coder, make_project, worktrees


async def run_with_check(tmp_path, check: str, check_timeout_s: float = 60):
    project = make_project(tmp_path)
    options = RunOptions(task=TASK, directory=project, check=check, agents=1, parts=1, max_steps=5,
                         timeout_s=120, sandbox=False, check_timeout_s=check_timeout_s)
    started = time.monotonic()
    async with FakeOpenAI(coder(good_agents={0})) as url, ChatClient(url) as client:
        report = await run_team(options, client)
    return project, report, time.monotonic() - started


def processes_with(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(marker in part for part in proc.info["cmdline"] or []):
            found.append(proc)
    return found


async def test_a_check_that_hangs_is_killed_at_its_time_limit(tmp_path):
    marker = uuid.uuid4().hex
    project, report, took = await run_with_check(tmp_path, f"sleep 600 # {marker}", check_timeout_s=2)
    assert report.parts[0].status == "failed" and "killed after 2 s" in report.parts[0].detail
    assert took < 60 and not processes_with(marker)
    assert len(worktrees(project)) == 1


async def test_a_check_that_floods_its_output_is_stopped(tmp_path):
    project, report, took = await run_with_check(tmp_path, "yes 'all work and no play'")
    assert report.parts[0].status == "failed"
    assert "MiB of output" in report.parts[0].detail and took < 60


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="`setsid` is util-linux's")
async def test_a_check_that_forks_a_daemon_ends_with_it_and_leaves_nothing_running(tmp_path):
    """The check passes (exit 0) but leaves `sleep` holding its output in a session of its own:
    the run goes on LINGER_S later, and the daemon is killed."""
    marker = uuid.uuid4().hex
    check = f"(setsid sh -c 'sleep 600 # {marker}' &); python3 -m pytest -q -p no:cacheprovider"
    project, report, took = await run_with_check(tmp_path, check)
    assert report.ok, report
    assert took < 60 and not processes_with(marker)


def test_output_memory_stays_bounded_whatever_the_volume():
    output = BoundedOutput(cap=1000)
    for i in range(10_000):
        output.add(f"line {i}\n".encode() * 10)
    assert len(output.head) == 500 and output.tail_bytes < 500 + 100
    text = output.text()
    assert text.startswith("line 0\n") and text.endswith("line 9999\n") and "characters cut" in text
