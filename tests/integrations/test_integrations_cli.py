"""`locals launch list`, `setup` / `disconnect` and server discovery against the real server app.

The app runs on 127.0.0.1 with the scripted engine of tests/helpers/server_fakes.py; the CLI runs in a
thread so the app keeps answering while the synchronous commands call it.
"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from typer.testing import CliRunner

from integrations import jsonc
from integrations.ollama import foreign_server
from integrations.serverinfo import served_model

from tests.helpers.server_fakes import ScriptedEngine, make_state, start_client

OPENCODE_JSONC = """{
  // theme first
  "theme": "opencode",
  "model": "anthropic/claude-sonnet-4-5", // my usual model
}
"""


@pytest.fixture
async def server():
    client = await start_client(make_state(ScriptedEngine()))
    yield str(client.make_url("")).rstrip("/")
    await client.close()


@pytest.fixture
def user_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("CODEX_HOME", raising=False)
    return home


def _invoke(*args: str):
    from locals.cli import app

    return CliRunner().invoke(app, list(args), catch_exceptions=False)


async def test_served_model_reads_name_and_context(server):
    assert await asyncio.to_thread(served_model, server) == ("fake", 8192)
    assert await asyncio.to_thread(served_model, server + "/v1") == ("fake", 8192)


async def test_setup_then_disconnect_through_the_cli(server, user_home, monkeypatch):
    monkeypatch.setattr("locals.cli.launch.ensure_server", lambda model, port, remember_port=True: server)
    config = user_home / ".config" / "opencode" / "opencode.json"
    config.parent.mkdir(parents=True)
    config.write_text(OPENCODE_JSONC)

    result = await asyncio.to_thread(_invoke, "setup", "opencode")
    assert result.exit_code == 0, result.output
    assert "locals disconnect opencode" in result.output
    value = jsonc.loads(config.read_text())
    assert value["model"] == "locals/fake"
    assert value["provider"]["locals"]["options"]["baseURL"] == server + "/v1"
    assert "// my usual model" in config.read_text()

    result = await asyncio.to_thread(_invoke, "disconnect", "opencode")
    assert result.exit_code == 0 and "restored from backup" in result.output
    assert config.read_text() == OPENCODE_JSONC
    result = await asyncio.to_thread(_invoke, "disconnect", "opencode")
    assert "nothing to undo" in result.output


async def test_setup_codex_writes_toml_and_disconnect_removes_the_new_file(server, user_home, monkeypatch):
    monkeypatch.setattr("locals.cli.launch.ensure_server", lambda model, port, remember_port=True: server)
    result = await asyncio.to_thread(_invoke, "setup", "codex")
    assert result.exit_code == 0, result.output
    import tomlkit

    doc = tomlkit.parse((user_home / ".codex" / "config.toml").read_text())
    assert doc["model_provider"] == "locals" and doc["model_providers"]["locals"]["wire_api"] == "responses"
    await asyncio.to_thread(_invoke, "disconnect", "codex")
    assert not (user_home / ".codex").exists()  # the folder setup made goes with the file


async def test_setup_refuses_a_model_the_tool_itself_would_refuse(server, user_home, monkeypatch):
    from locals.errors import LocalsError

    monkeypatch.setattr("locals.cli.launch.ensure_server", lambda model, port, remember_port=True: server)
    with pytest.raises(LocalsError, match="needs a model with at least 64,000 tokens"):
        await asyncio.to_thread(_invoke, "setup", "hermes")
    assert not (user_home / ".hermes").exists()


async def test_launch_editor_prints_the_settings(server, monkeypatch):
    monkeypatch.setattr("locals.cli.launch.ensure_server", lambda model, port, remember_port=True: server)
    result = await asyncio.to_thread(_invoke, "launch", "editor")
    assert result.exit_code == 0, result.output
    assert f"{server}/v1" in result.output and "locals/fake" in result.output and "8192" in result.output


def test_launch_list_shows_every_tool(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "80")  # piped, the table still shows install commands whole
    result = _invoke("launch", "list")
    assert result.exit_code == 0
    for name in ("opencode", "claude", "cline", "kilo", "aider", "openhands", "hermes", "openclaw",
                 "codex", "ollama", "editor"):
        assert name in result.output
    assert "not installed" in result.output and "npm install -g opencode-ai" in result.output
    assert "npm install -g @anthropic-ai/claude-code" in result.output


def test_launch_of_a_missing_tool_says_how_to_install(monkeypatch, tmp_path):
    from locals.errors import LocalsError

    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LocalsError, match="npm install -g @openai/codex"):
        _invoke("launch", "codex")


def test_a_missing_tool_that_needs_a_newer_runtime_says_both(monkeypatch, tmp_path):
    from locals.errors import LocalsError

    node = tmp_path / "node"
    node.write_text("#!/bin/sh\necho v20.20.2\n")
    node.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LocalsError, match=r"npm install -g openclaw.*needs node >= 24; this machine has node 20"):
        _invoke("launch", "openclaw")


async def test_ollama_port_check_tells_locals_from_ollama(server):
    port = int(server.rsplit(":", 1)[1])
    assert await asyncio.to_thread(foreign_server, port) is False  # locals itself

    async def ollama_models(request):
        return web.json_response({"object": "list", "data": [{"id": "llama3.2:latest"}]})

    app = web.Application()
    app.router.add_get("/v1/models", ollama_models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    other = site._server.sockets[0].getsockname()[1]
    try:
        assert await asyncio.to_thread(foreign_server, other) is True
    finally:
        await runner.cleanup()
    assert await asyncio.to_thread(foreign_server, other) is False  # nothing listens now


def test_setup_of_a_tool_without_settings_refuses_before_starting_a_server(monkeypatch):
    from locals.errors import LocalsError

    started = []
    monkeypatch.setattr("locals.cli.launch.ensure_server", lambda model, port, remember_port=True: started.append(port))
    for tool in ("ollama", "editor"):
        with pytest.raises(LocalsError, match="no settings file of its own for setup to change"):
            _invoke("setup", tool)
    assert started == []


def test_unknown_tool_is_a_clear_error():
    from locals.errors import LocalsError

    with pytest.raises(LocalsError, match="unknown tool 'vim'"):
        _invoke("disconnect", "vim")


def test_code_without_opencode_names_its_install_command(monkeypatch, tmp_path):
    from locals.errors import LocalsError

    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LocalsError, match="npm install -g opencode-ai"):
        _invoke("code", str(tmp_path))


async def test_code_refuses_a_folder_that_does_not_exist(server, monkeypatch, tmp_path):
    from locals.errors import LocalsError

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "opencode").write_text("#!/bin/sh\necho 1.0.0\n")
    (fake / "opencode").chmod(0o755)
    monkeypatch.setenv("PATH", str(fake))
    monkeypatch.setattr("locals.cli.launch.ensure_server", lambda model, port, remember_port=True: server)
    with pytest.raises(LocalsError, match="is not a folder"):
        await asyncio.to_thread(_invoke, "code", str(tmp_path / "missing"))


async def test_launch_ollama_serves_on_ollamas_port(server, monkeypatch):
    ports = []
    monkeypatch.setattr("locals.cli.launch.ensure_server",
                        lambda model, port, remember_port=True: ports.append((port, remember_port)) or server)
    monkeypatch.setattr("integrations.ollama.foreign_server", lambda port: False)
    result = await asyncio.to_thread(_invoke, "launch", "ollama")
    assert result.exit_code == 0, result.output
    assert ports == [(11434, False)] and "Ollama URL" in result.output  # Ollama's port is not the user's next one


@pytest.mark.parametrize("args, needle", [
    (["launch", "editor", "--run", "do x"], "--run and extra arguments have no effect"),
    (["launch", "editor", "--", "--foo"], "--run and extra arguments have no effect"),
    (["launch", "ollama", "--port", "8399"], "look on port 11434"),
    (["code", "--run", " "], "--run is empty"),
])
def test_launch_arguments_that_would_do_nothing_are_refused_before_a_server_starts(args, needle, monkeypatch):
    from locals.errors import LocalsError

    monkeypatch.setattr("locals.cli.launch.ensure_server", lambda model, port, remember_port=True: pytest.fail("a server was started"))
    with pytest.raises(LocalsError, match=needle):
        _invoke(*args)
