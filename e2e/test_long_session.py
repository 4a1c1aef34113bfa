"""A real OpenCode session on the embedded model carries on without a context error.

`locals code DIR --run TASK` drives OpenCode through a task of many turns (read ten files, one
at a time, and note each in a file) for MINUTES (15) or to its end. The
launch told OpenCode the model's window and the reply's room, so OpenCode compacts its history
before a request outgrows the window; the server keeps its default overflow policy (refuse), so
a prompt past the window would show as a 400 in the access log. Replies stop at REPLY_CAP tokens:
the tiny model often rambles to OpenCode's 4,096-token limit (its title request too), which on
two CPU cores, with two rows decoding after 8k-token prompts, takes longer than the session.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


pytestmark = pytest.mark.slow

TOOLS_BIN = Path(os.environ.get("LOCALS_TOOLS_HOME") or Path.home() / ".cache" / "locals-e2e-tools") / "bin"
MINUTES = 15  # the bar: a session this long, or to its end, without a context error
FILES = 10
REPLY_CAP = 512
TASK = (f"There are {FILES} Python files here, part0.py to part{FILES - 1}.py. Read them one at a time, in "
        "order, and after reading each one append a line to NOTES.md saying what its function returns.")


def _project(folder: Path) -> None:
    for i in range(FILES):
        body = "\n".join(f"    step_{j} = value * {j + i} + {j}  # step {j} of part {i}" for j in range(40))
        (folder / f"part{i}.py").write_text(f'"""Part {i} of the sum."""\n\n\ndef part_{i}(value):\n{body}\n'
                                            f"    return value + {i}\n")


@pytest.mark.timeout(MINUTES * 60 + 600)
def test_opencode_session_runs_without_a_context_error(capped_server, tmp_path):
    if not (TOOLS_BIN / "opencode").exists():
        pytest.skip("opencode is not installed; run e2e/setup_tools.sh")
    home, work = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    work.mkdir()
    _project(work)
    server = capped_server("session-home", REPLY_CAP)
    log_path = server.home / "log" / f"server-{server.port}.log"
    offset = log_path.stat().st_size if log_path.exists() else 0
    env = {**server.env, "HOME": str(home), "PATH": f"{TOOLS_BIN}{os.pathsep}{os.environ['PATH']}"}
    argv = [sys.executable, "-m", "locals", "code", str(work), "--port", str(server.port), "--run", TASK]
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env, cwd=work, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=MINUTES * 60)
        ended = True
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
        ended = False
    with log_path.open("rb") as handle:
        handle.seek(offset)
        log = handle.read().decode("utf-8", "replace")
    minutes = (time.monotonic() - started) / 60
    answered = re.findall(r'"POST /v1/chat/completions HTTP/[\d.]+" 200 ', log)
    refused = re.findall(r'"POST /v1/chat/completions HTTP/[\d.]+" 400 ', log)
    print(f"{minutes:.1f} min, {len(answered)} requests answered, ended: {ended}")
    assert not refused and "maximum context length" not in output, output[-3000:]
    assert answered and (not ended or proc.returncode == 0), output[-3000:]
