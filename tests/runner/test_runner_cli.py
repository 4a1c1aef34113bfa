"""`locals run` as users call it: exit codes, --json, question mode, Ctrl-C in a real process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from locals.cli import app

from tests.helpers.fake_openai import FakeOpenAI, call, calls
from tests.helpers.runner_project import CHECK, GOOD_CODE, TASK, coder, make_project, worktrees

# Every test runs `locals run`, which refuses to start without a sandbox for the agents' commands.
pytestmark = pytest.mark.needs_sandbox


def invoke(*args: str):
    return CliRunner().invoke(app, ["run", *args])


def test_readme_example_with_json_output(tmp_path):
    project = make_project(tmp_path)
    with FakeOpenAI(coder(good_agents={0})).in_thread() as url:
        result = invoke(TASK, "--dir", str(project), "--check", CHECK, "--server", url, "--agents", "2", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["ok"] and report["parts"][0]["status"] == "applied"
    assert (project / "wordcount.py").read_text() == GOOD_CODE


def test_a_failed_run_exits_non_zero_and_says_why(tmp_path):
    project = make_project(tmp_path)
    with FakeOpenAI(coder(good_agents=set())).in_thread() as url:
        result = invoke(TASK, "--dir", str(project), "--check", CHECK, "--server", url, "--agents", "1",
                        "--max-steps", "4")
    assert result.exit_code == 1
    assert "part 1 failed" in result.output and "passed the check" in result.output
    assert not (project / "wordcount.py").exists()


def test_question_mode_prints_the_answer(tmp_path):
    project = make_project(tmp_path)

    def script(body):
        return calls(call("finish", summary="It keeps notes in notes.txt."))

    with FakeOpenAI(script).in_thread() as url:
        result = invoke("What is in this project?", "--dir", str(project), "--server", url)
    assert result.exit_code == 0, result.output
    assert "It keeps notes in notes.txt." in result.stdout


def test_bad_input_is_refused_with_advice(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    result = invoke("x", "--dir", str(plain), "--server", "http://127.0.0.1:9")
    assert result.exit_code != 0 and "git init" in str(result.exception)
    result = invoke("x", "--dir", str(make_project(tmp_path)), "--parts", "many", "--server", "http://127.0.0.1:9")
    assert "--parts must be" in str(result.exception)
    result = invoke("x", "--dir", str(tmp_path / "project"), "--server", "notaurl")
    assert result.exit_code != 0 and "http://" in str(result.exception)
    project = str(tmp_path / "project")
    for check, needle in (("pytset -q", "`pytset` is not a command"), ("  ", "--check is empty"),
                          ("./run_tests.sh", "`./run_tests.sh` is not a command"), ("'open", "quotes"),
                          ("./README.md", "`./README.md` is not executable; run `chmod +x")):
        result = invoke("x", "--dir", project, "--check", check, "--server", "http://127.0.0.1:9")
        assert result.exit_code != 0 and needle in str(result.exception), (check, result.exception)
    for args, needle in ((["  "], "the task is empty"), (["x", "--port", "8400"], "--port names the locals daemon"),
                         (["x", "--parts", "2"], "drop --parts or add --check")):
        result = invoke(*args, "--dir", project, "--server", "http://127.0.0.1:9")
        assert result.exit_code != 0 and needle in str(result.exception), (args, result.exception)
    from locals.cli.run import _check_runnable
    script = tmp_path / "project" / "check.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    for fine in ("python3 -m pytest -q", "CI=1 python3 -m pytest", "cd sub && make test", "test -f README.md",
                 f"{sys.executable} -m pytest", "./check.sh", "sh ./README.md"):
        _check_runnable(fine, tmp_path / "project")


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_in_a_real_process_cleans_up(tmp_path, locals_home, stop_signal):
    project = make_project(tmp_path)
    fake = FakeOpenAI(coder(good_agents={0}), delay_s=60)
    with fake.in_thread() as url:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from locals.cli import main; main()", "run", TASK, "--dir", str(project),
             "--check", CHECK, "--server", url, "--agents", "2", "--parts", "1", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
            # As from a terminal: a shell running this suite in the background without job
            # control (`cmd &` in a script) leaves SIGINT ignored, and children inherit that.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        deadline = time.monotonic() + 60
        while len(fake.requests) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert len(worktrees(project)) == 3
        proc.send_signal(stop_signal)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            raise AssertionError(f"the run did not stop within 60 s of Ctrl-C; its stderr:\n{err[-3000:]}") from None
    assert proc.returncode == 128 + stop_signal, err  # 130 after Ctrl-C, 143 after SIGTERM
    stopped = json.loads(out)  # --json: JSON on stdout even when stopped
    assert stopped["ok"] is False and stopped["stopped"] and stopped["message"] in err
    assert len(worktrees(project)) == 1
    assert not list((locals_home / "state" / "runs").iterdir())
    assert (project / "notes.txt").read_text() == "first line\nuncommitted line\n"
