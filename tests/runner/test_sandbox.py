"""Confinement of the agents' commands and tool paths: writes stay in the worktree, no network."""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from agents.sandbox import SandboxUnavailable, check_bwrap, macos_profile, make_sandbox, run_confined, Sandbox
from agents.tools import READ_TOOLS, WRITE_TOOLS, Toolbox
from locals.client import ChatClient

from tests.helpers.fake_openai import FakeOpenAI, call, calls
from tests.helpers.runner_project import make_project, tool_results

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="bubblewrap and Landlock are Linux's")


@pytest.fixture
def area(tmp_path):
    worktree, tmp, outside = tmp_path / "wt", tmp_path / "wt-tmp", tmp_path / "outside"
    for path in (worktree, tmp, outside):
        path.mkdir()
    return worktree, tmp, outside


@pytest.mark.needs_sandbox
async def test_commands_write_in_the_worktree_and_temp_only(area):
    worktree, tmp, outside = area
    box = make_sandbox(worktree, tmp)
    ok = await run_confined('echo hi > made.txt && echo t > "$TMPDIR/t" && cat made.txt', worktree, box)
    assert ok.ok and ok.output.strip() == "hi"
    assert (worktree / "made.txt").exists() and (tmp / "t").exists()

    denied = await run_confined(f"echo pwned > {outside}/x", worktree, box)
    assert not denied.ok
    assert not (outside / "x").exists()
    home = await run_confined("echo pwned > ~/.locals-sandbox-probe", worktree, box)
    assert not home.ok and "Read-only" in home.output


@pytest.mark.needs_sandbox
async def test_the_users_credentials_and_session_services_are_out_of_sight(area, monkeypatch):
    worktree, tmp, _ = area
    home = Path(tempfile.mkdtemp(dir="/var/tmp"))  # outside the private /tmp, as a real home is
    try:
        (home / ".ssh").mkdir()
        (home / ".ssh" / "id_rsa").write_text("SECRETKEY")
        (home / ".netrc").write_text("machine example.com password hunter2")
        (home / ".cache").mkdir()
        (home / "run").mkdir()
        (home / "run" / "bus").write_text("a session service's socket")
        (home / "agents").mkdir()
        (home / "agents" / "ssh.sock").write_text("an ssh agent's socket")
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(home / "run"))
        monkeypatch.setenv("MY_API_TOKEN", "abc123")
        monkeypatch.setenv("APP_DB", "postgres://app:dbpass@db/app")
        monkeypatch.setenv("SSH_AUTH_SOCK", str(home / "agents" / "ssh.sock"))  # wherever it is, hidden
        probe = (f"cat ~/.ssh/id_rsa ~/.netrc {home}/run/bus {home}/agents/ssh.sock; env; echo x > {home}/.cache/poison; "
                 'echo y > "$XDG_CACHE_HOME/own" && echo private-cache-ok')
        confined = await run_confined(probe, worktree, make_sandbox(worktree, tmp))
        poisoned = (home / ".cache" / "poison").exists()
        unconfined = await run_confined(probe, worktree, make_sandbox(worktree, tmp, enabled=False))
    finally:
        shutil.rmtree(home)
    out = confined.output
    assert not any(secret in out for secret in ("SECRETKEY", "hunter2", "abc123", "dbpass", "service's socket",
                                                   "agent's socket")), out
    assert "SSH_AUTH_SOCK" not in out and "private-cache-ok" in out
    assert f"HOME={home}" in out  # the rest of the environment is the user's
    assert not poisoned and "Read-only file system" in out  # the user's cache: tools run what they keep there
    assert "SECRETKEY" in unconfined.output and "MY_API_TOKEN=abc123" in unconfined.output  # --no-sandbox: all


@pytest.mark.needs_sandbox
async def test_no_network_by_default(area):
    worktree, tmp, _ = area
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    probe = f"{sys.executable} -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2); print('connected')\""
    async with server:
        blocked = await run_confined(probe, worktree, make_sandbox(worktree, tmp))
        allowed = await run_confined(probe, worktree, make_sandbox(worktree, tmp, network=True))
    # In its own network namespace the command sees an empty loopback, not the host's server.
    assert not blocked.ok and "Connection refused" in blocked.output
    assert allowed.ok and "connected" in allowed.output


@pytest.mark.needs_sandbox
async def test_timeout_kills_the_command_and_output_is_capped(area):
    worktree, tmp, _ = area
    box = make_sandbox(worktree, tmp)
    slow = await run_confined("sleep 30", worktree, box, timeout_s=0.5)
    assert slow.timed_out and not slow.ok
    loud = await run_confined("yes | head -c 100000", worktree, box, cap=1000)
    assert len(loud.output) < 1200 and "characters cut" in loud.output


def test_missing_bwrap_says_how_to_install(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr("agents.sandbox._bwrap_ok", None)
    with pytest.raises(SandboxUnavailable, match="apt install bubblewrap"):
        check_bwrap()


def test_macos_profile_allows_writes_only_in_the_given_folders(tmp_path):
    (tmp_path / ".ssh").mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(tmp_path))
        profile = macos_profile(Sandbox([tmp_path], kind="sandbox-exec"))
    assert "(deny file-write*)" in profile and f'(subpath "{tmp_path.resolve()}")' in profile
    assert "(deny network*)" in profile
    assert f'(deny file-read* (subpath "{(tmp_path / ".ssh").resolve()}")' in profile


@pytest.mark.needs_sandbox
async def test_tool_paths_cannot_leave_the_worktree(area):
    worktree, tmp, outside = area
    tools = Toolbox(worktree, make_sandbox(worktree, tmp), WRITE_TOOLS)
    for path in ("../outside/x", str(outside / "x"), ".git/config"):
        result = await tools.execute("write_file", {"path": path, "content": "x"})
        assert not result.ok, path
    (worktree / "link").symlink_to(outside)
    assert not (await tools.execute("write_file", {"path": "link/x", "content": "x"})).ok
    assert not list(outside.iterdir())
    assert (await tools.execute("write_file", {"path": "a/b.txt", "content": "x"})).changed
    assert (await tools.execute("read_file", {"path": "a/b.txt"})).text == "x"


@pytest.mark.needs_sandbox
async def test_edit_search_and_list(area):
    worktree, tmp, _ = area
    tools = Toolbox(worktree, make_sandbox(worktree, tmp), WRITE_TOOLS)
    (worktree / "m.py").write_text("def f():\n    return 1\n\ndef g():\n    return 1\n")
    twice = await tools.execute("edit_file", {"path": "m.py", "old_text": "return 1", "new_text": "return 2"})
    assert not twice.ok and "2 times" in twice.text
    once = await tools.execute("edit_file", {"path": "m.py", "old_text": "def g():\n    return 1",
                                             "new_text": "def g():\n    return 2"})
    assert once.ok and "return 2" in (worktree / "m.py").read_text()
    assert (await tools.execute("search", {"pattern": r"def \w+"})).text.count("m.py:") == 2
    assert (await tools.execute("list_files", {"path": "."})).text == "m.py"
    readonly = Toolbox(worktree, make_sandbox(worktree, tmp), READ_TOOLS)
    assert "unknown tool" in (await readonly.execute("write_file", {"path": "x", "content": ""})).text


async def test_a_fifo_or_a_huge_file_never_stalls_the_runner(area):
    import os

    worktree, tmp, _ = area
    tools = Toolbox(worktree, Sandbox([worktree, tmp], kind="none", tmp_dir=tmp), WRITE_TOOLS)
    os.mkfifo(worktree / "pipe")  # opened, it would block until a writer came
    for name, args in (("read_file", {"path": "pipe"}), ("write_file", {"path": "pipe", "content": "x"}),
                       ("edit_file", {"path": "pipe", "old_text": "a", "new_text": "b"})):
        result = await asyncio.wait_for(tools.execute(name, args), 5)
        assert not result.ok and "not a regular file" in result.text, name
    with open(worktree / "big.txt", "wb") as f:  # 3 GB, sparse: read whole, it would fill the memory
        f.write(b"first line\n")
        f.truncate(3_000_000_000)
        f.seek(3_000_000_000 - 10)
        f.write(b"last line\n")
    read = await asyncio.wait_for(tools.execute("read_file", {"path": "big.txt"}), 5)
    assert read.ok and read.text.startswith("first line") and read.text.endswith("last line\n")
    assert "bytes cut" in read.text and len(read.text) < 20_000
    edit = await tools.execute("edit_file", {"path": "big.txt", "old_text": "first", "new_text": "1st"})
    assert not edit.ok and "change it with `run`" in edit.text


@pytest.mark.needs_sandbox
async def test_a_tool_call_the_files_cannot_take_is_the_agents_error_not_the_runs(area):
    worktree, tmp, _ = area
    tools = Toolbox(worktree, make_sandbox(worktree, tmp), WRITE_TOOLS)
    (worktree / "latin.py").write_bytes(b"caf\xe9 = 1\n")
    edit = await tools.execute("edit_file", {"path": "latin.py", "old_text": "1", "new_text": "2"})
    assert edit.ok and (worktree / "latin.py").read_bytes() == b"caf\xe9 = 2\n"  # its other bytes kept as they were
    for name, args in (("read_file", {"path": "a\x00b"}), ("write_file", {"path": "s.py", "content": "\ud800"})):
        result = await tools.execute(name, args)
        assert not result.ok and result.text.startswith("error: "), (name, result.text)


@pytest.mark.needs_sandbox
async def test_an_agents_run_that_writes_outside_its_worktree_fails(tmp_path):
    """Through the whole runner: the agent's shell command cannot touch the user's project."""
    from agents.runner import RunOptions, run_team

    project = make_project(tmp_path)
    target = project / "notes.txt"

    def script(body):
        if body.get("response_format"):
            return {"content": '{"parts": [{"goal": "x", "files": [], "depends_on": []}]}', "tool_calls": []}
        return calls(call("run", command=f"echo clobbered > {target}; echo rc=$?"),
                     call("write_file", path=str(target), content="clobbered"),
                     call("finish", summary="tried"))

    fake = FakeOpenAI(script)
    async with fake as url, ChatClient(url) as client:
        opts = RunOptions(task="x", directory=project, check="true", agents=1, max_steps=2, parts=1)
        report = await run_team(opts, client)
    assert not report.ok
    assert target.read_text() == "first line\nuncommitted line\n"
    results = tool_results(fake)
    assert any("rc=1" in r or "rc=2" in r for r in results), results
    assert any("outside the project" in r for r in results), results


@pytest.mark.skipif(not __import__("agents.landlock_box").landlock_box.available(), reason="needs Landlock")
async def test_landlock_fallback_confines_writes(area, monkeypatch):
    worktree, tmp, _ = area
    monkeypatch.setattr("agents.sandbox.check_bwrap", lambda: (_ for _ in ()).throw(SandboxUnavailable("no bwrap")))
    with pytest.raises(SandboxUnavailable, match="--network"):
        make_sandbox(worktree, tmp)  # Landlock cannot cut the network: not chosen silently
    box = make_sandbox(worktree, tmp, network=True)
    assert box.kind == "landlock"
    inside = await run_confined("echo ok > made.txt && echo t > /dev/null && cat made.txt", worktree, box)
    assert inside.ok and inside.output.strip() == "ok"
    home = await run_confined("echo x > ~/.locals-landlock-probe", worktree, box)
    assert not home.ok and "Permission denied" in home.output
