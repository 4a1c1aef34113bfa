"""Real agent tools, started by `locals launch TOOL --run …`, complete a request on the daemon.

e2e/setup_tools.sh installs the tools under $LOCALS_TOOLS_HOME (a tool it could not install
is skipped with the reason). Each test runs the tool headless through the locals CLI,
watches the daemon's access log until a call from the tool to its API has been answered
with 200, then stops the tool: the tiny model's answers are not judged, the wire is.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest


pytestmark = pytest.mark.slow

TOOLS_BIN = Path(os.environ.get("LOCALS_TOOLS_HOME") or Path.home() / ".cache" / "locals-e2e-tools") / "bin"
TIMEOUT_S = float(os.environ.get("LOCALS_E2E_TOOL_TIMEOUT", "900"))
TASK = "Reply with the single word: hello"

# tool -> (executable, API path it must call, extra tool arguments)
CASES = {
    "opencode": ("opencode", "/v1/chat/completions", []),
    "claude": ("claude", "/v1/messages", []),
    "cline": ("cline", "/v1/chat/completions", []),
    "aider": ("aider", "/v1/chat/completions", ["--no-git", "--map-tokens", "0"]),
    "codex": ("codex", "/v1/responses", []),
    "hermes": ("hermes", "/v1/chat/completions", []),
    "kilo": ("kilo", "/v1/chat/completions", []),
    "openhands": ("openhands", "/v1/chat/completions", []),
}
API_OF = {"/v1/chat/completions": "openai", "/v1/messages": "anthropic", "/v1/responses": "responses"}
UNFINISHED = {"running", "cancelled", "error"}
HERMES_MIN_CONTEXT = 64000  # Hermes Agent refuses to start on a smaller window
REPLY_CAP = 192  # tokens: the tools' replies are not judged, the wire is


def _answered(log: Path, offset: int, api_path: str) -> list[str]:
    """Access-log lines after `offset` for `api_path` answered with 200."""
    if not log.exists():
        return []
    with log.open("rb") as handle:
        handle.seek(offset)
        text = handle.read().decode("utf-8", "replace")
    pattern = re.compile(rf'"POST {re.escape(api_path)}(\?[^ ]*)? HTTP/[\d.]+" 200 ')
    return [line for line in text.splitlines() if pattern.search(line)]


def _stop(proc: subprocess.Popen, work: Path) -> str:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # Some tools leave a helper in its own session (Cline's hub); it names the test's folder.
    for helper in psutil.process_iter(["cmdline"]):
        if str(work) in " ".join(helper.info["cmdline"] or []):
            helper.kill()
    return (proc.stdout.read() if proc.stdout else "")[-3000:]


def _refused_on(tool: str, context: int) -> bool:
    """Whether `locals launch` refuses the tool on a model with this window (its first prompt)."""
    from integrations.base import LaunchContext, get_tool

    spec = get_tool(tool)
    window = LaunchContext("", "", context).context_window(spec.context_wanted)
    return not LaunchContext.first_prompt_fits(window, spec.first_prompt)


def _finished_since(server, api: str, since: float) -> list[dict]:
    """The server's records of `api` requests started after `since` that ran to an end."""
    recent = server.get_json("/v1/locals/status")["requests"]["recent"]
    return [r for r in recent if r["api"] == api and r["started"] >= since and r["finish"] not in UNFINISHED]


@pytest.fixture(scope="module")
def tools_server(capped_server):
    """A daemon whose replies stop at REPLY_CAP tokens (some tools, Codex, send no limit)."""
    return capped_server("tools-home", REPLY_CAP)


@pytest.mark.timeout(TIMEOUT_S + 120)
@pytest.mark.parametrize("tool", list(CASES))
def test_tool_completes_a_request_through_locals(tool, tools_server, tmp_path, request):
    locals_server = tools_server
    executable, api_path, extra = CASES[tool]
    chosen = request.config.getoption("--tools", "all")
    names = set(chosen.split(","))
    unknown = names - {"all", *CASES}
    if unknown:
        pytest.fail(f"--tools {chosen}: no such tool {', '.join(sorted(unknown))}; they are {', '.join(CASES)}")
    if "all" not in names and tool not in names:
        pytest.skip(f"not among --tools {chosen}")
    if not (TOOLS_BIN / executable).exists() and shutil.which(executable) is None:
        pytest.skip(f"{executable} is not installed; run e2e/setup_tools.sh")
    context = locals_server.get_json("/v1/locals/status").get("context_length") or 0
    if tool == "hermes" and context < HERMES_MIN_CONTEXT:
        pytest.skip(f"Hermes Agent needs a {HERMES_MIN_CONTEXT}-token window; the model has {context}")
    home, work = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    work.mkdir()
    (work / "notes.txt").write_text("a file for the agent to look at\n")
    env = {**locals_server.env, "HOME": str(home), "PATH": f"{TOOLS_BIN}{os.pathsep}{os.environ['PATH']}"}
    log = locals_server.home / "log" / f"server-{locals_server.port}.log"
    offset = log.stat().st_size if log.exists() else 0

    argv = [sys.executable, "-m", "locals", "launch", tool, "--port", str(locals_server.port),
            "--dir", str(work), "--run", TASK, "--", *extra]
    if _refused_on(tool, context):  # the window cannot hold its first prompt and a reply: launch says so
        result = subprocess.run(argv, env=env, cwd=work, stdin=subprocess.DEVNULL, capture_output=True,
                                text=True, timeout=300)
        assert result.returncode != 0 and f"locals launch {tool} --model qwen" in result.stderr, result.stderr
        return
    started = time.time()
    proc = subprocess.Popen(argv, env=env, cwd=work, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline, finished = time.monotonic() + TIMEOUT_S, []
    while time.monotonic() < deadline and not finished and proc.poll() is None:
        time.sleep(2)
        finished = _finished_since(locals_server, API_OF[api_path], started)
    time.sleep(1)  # the access log line is written as the response closes
    finished = finished or _finished_since(locals_server, API_OF[api_path], started)
    answered = _answered(log, offset, api_path)
    output = _stop(proc, work)
    assert finished, f"no {API_OF[api_path]} request from {tool} ran to an end; its output:\n{output}"
    assert answered, f"no answered {api_path} call from {tool} in the access log; its output:\n{output}"


def test_launch_list_shows_installed_tools(locals_server):
    env = {**locals_server.env, "PATH": f"{TOOLS_BIN}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run([sys.executable, "-m", "locals", "launch", "list"], env=env, text=True,
                            capture_output=True, timeout=300)
    assert result.returncode == 0, result.stderr
    rows = {line.split()[1]: line for line in result.stdout.splitlines() if line.startswith("│ ")}
    for tool, (executable, _, _) in CASES.items():
        if (TOOLS_BIN / executable).exists():
            assert "installed" in rows[tool] and "not installed" not in rows[tool], result.stdout
