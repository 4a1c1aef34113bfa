"""Each tool's launch: the argv and environment it gets, its context window, its own files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from integrations import launcher
from integrations.base import MIN_REPLY, LaunchContext, all_tools, get_tool
from locals.errors import LocalsError

BASE = "http://127.0.0.1:8321"


@pytest.fixture(autouse=True)
def _user_home(tmp_path, monkeypatch):
    """Tools' own files (~/.claude.json, ~/.config/opencode, …) live in a temp home."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for var in ("XDG_CONFIG_HOME", "CLAUDE_CONFIG_DIR", "CODEX_HOME", "HERMES_HOME",
                "OPENCLAW_CONFIG_PATH", "OPENCLAW_STATE_DIR", "CLINE_DIR"):
        monkeypatch.delenv(var, raising=False)
    return home


def ctx_for(tmp_path, context_length=8192, task=None) -> LaunchContext:
    return LaunchContext(BASE, "smollm2", context_length, tmp_path, task, tmp_path / "state")


def test_registry_has_every_tool():
    names = {tool.name for tool in all_tools()}
    assert names == {"opencode", "claude", "cline", "kilo", "aider", "openhands", "hermes",
                     "openclaw", "codex", "ollama", "editor"}
    assert get_tool("claude-code").name == "claude"
    with pytest.raises(LocalsError, match="locals launch list"):
        get_tool("vim")


def test_opencode_gets_a_locals_provider_at_launch(tmp_path):
    tool = get_tool("opencode")
    plan = launcher.plan(tool, ctx_for(tmp_path), [], base_env={"PATH": "/bin"})
    assert plan.argv == ["opencode", str(tmp_path)]
    config = json.loads(plan.env["OPENCODE_CONFIG_CONTENT"])
    provider = config["provider"]["locals"]
    assert provider["options"]["baseURL"] == BASE + "/v1"
    assert provider["models"]["smollm2"]["limit"]["context"] == 8192  # 32k capped by the model
    assert config["model"] == "locals/smollm2"
    assert plan.changes == []  # nothing of the user's is written for a launch
    headless = tool.command(ctx_for(tmp_path, task="add a test"), [])
    assert headless == ["opencode", "run", "add a test", "--dir", str(tmp_path)]


@pytest.mark.parametrize("name, wanted", [("opencode", 32768), ("kilo", 65536), ("hermes", 65536),
                                          ("openclaw", 65536), ("claude", 32768)])
def test_context_window_is_the_tools_size_capped_by_the_model(tmp_path, name, wanted):
    tool = get_tool(name)
    assert ctx_for(tmp_path, context_length=None).context_window(tool.context_wanted) == wanted
    assert ctx_for(tmp_path, context_length=262144).context_window(tool.context_wanted) == wanted
    assert ctx_for(tmp_path, context_length=8192).context_window(tool.context_wanted) == 8192


def test_claude_env_and_first_run(tmp_path, _user_home):
    tool = get_tool("claude")
    ctx = ctx_for(tmp_path, task="say hi")
    plan = launcher.plan(tool, ctx, ["--verbose"], base_env={"ANTHROPIC_API_KEY": "sk-real"})
    assert plan.argv[:2] == ["claude", "--settings"] and plan.argv[3:] == ["-p", "say hi", "--verbose"]
    env = plan.env
    # On the command line as well: it outranks an `env` in ~/.claude/settings.json, which outranks `env`.
    assert json.loads(plan.argv[2])["env"] == {k: v for k, v in env.items() if k in json.loads(plan.argv[2])["env"]}
    assert json.loads(plan.argv[2])["env"]["ANTHROPIC_BASE_URL"] == BASE
    assert env["ANTHROPIC_BASE_URL"] == BASE and env["ANTHROPIC_AUTH_TOKEN"] == "locals"
    assert "ANTHROPIC_API_KEY" not in env  # would override the token
    assert env["ANTHROPIC_MODEL"] == env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] == "smollm2"
    # (8,192 is too small for its first prompt: launch refuses it before this; the reply is the least.)
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "8192" and env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "1024"
    # The onboarding answer goes into ~/.claude.json through the manifest, and comes back out.
    [change] = plan.changes
    assert change.path == _user_home / ".claude.json"
    (_user_home / ".claude.json").write_text('{"numStartups": 3}')
    launcher.apply_changes(tool, plan.changes)
    assert json.loads((_user_home / ".claude.json").read_text())["hasCompletedOnboarding"] is True
    assert tool.configure(ctx) == []  # already answered: nothing more to change
    from integrations import configfiles

    configfiles.revert("claude")
    assert (_user_home / ".claude.json").read_text() == '{"numStartups": 3}'


def test_codex_uses_the_responses_api_by_overrides(tmp_path):
    argv = get_tool("codex").command(ctx_for(tmp_path, task="fix it"), [])
    assert argv[:3] == ["codex", "exec", "--skip-git-repo-check"] and argv[-1] == "fix it"
    overrides = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-c")
    assert overrides["model_provider"] == '"locals"'
    assert overrides["model_providers.locals.wire_api"] == '"responses"'
    assert overrides["model_providers.locals.base_url"] == f'"{BASE}/v1"'
    assert overrides["model_context_window"] == "8192"
    # Its 6,436-token first prompt leaves 1,756 of 8,192: the least reply (launch refuses that window).
    assert overrides["model_auto_compact_token_limit"] == "7168"


def test_aider_metadata_file_carries_the_window(tmp_path):
    argv = get_tool("aider").command(ctx_for(tmp_path, task="explain"), [])
    assert argv[argv.index("--model") + 1] == "openai/smollm2"
    assert argv[argv.index("--openai-api-base") + 1] == BASE + "/v1"
    metadata = json.loads(Path(argv[argv.index("--model-metadata-file") + 1]).read_text())
    assert metadata["openai/smollm2"]["max_input_tokens"] == 8192 - 2048
    assert metadata["openai/smollm2"]["max_output_tokens"] == 2048
    assert argv[argv.index("--message") + 1] == "explain"


def test_cline_provider_goes_into_a_config_dir_of_our_own(tmp_path):
    tool = get_tool("cline")
    ctx = ctx_for(tmp_path, task="hi")
    own = tmp_path / "state" / "cline"
    argv = tool.command(ctx, [])
    assert argv[argv.index("--config") + 1] == str(own) and "--json" in argv and argv[1] == "hi"
    providers = json.loads((own / "data" / "settings" / "providers.json").read_text())
    settings = providers["providers"]["openai-compatible"]["settings"]
    assert settings["baseUrl"] == BASE + "/v1" and settings["model"] == "smollm2"
    # Input budget and reply: the 5,432-token first prompt leaves 2,760 of 8,192, half for the reply.
    assert (settings["contextWindow"], settings["maxTokens"]) == (8192 - 1380, 1380)
    assert providers["providers"]["openai-compatible"]["updatedAt"].endswith("Z")  # Cline skips an entry without it


def test_hermes_and_openhands_env(tmp_path):
    hermes = launcher.plan(get_tool("hermes"), ctx_for(tmp_path, task="q"), [], base_env={})
    assert hermes.env["CUSTOM_BASE_URL"] == BASE + "/v1"
    assert hermes.argv == ["hermes", "chat", "--provider", "custom", "-m", "smollm2", "-q", "q", "-Q"]
    openhands = launcher.plan(get_tool("openhands"), ctx_for(tmp_path), [], base_env={})
    assert openhands.env["LLM_MODEL"] == "openai/smollm2" and openhands.env["LLM_BASE_URL"] == BASE + "/v1"
    assert openhands.argv == ["openhands", "--override-with-envs"]


def test_setup_values_of_each_tool_with_files(tmp_path, _user_home):
    ctx = ctx_for(tmp_path)
    paths = {name: [c.path for c in get_tool(name).setup_values(ctx)]
             for name in ("opencode", "kilo", "claude", "cline", "aider", "hermes", "openclaw", "codex")}
    assert paths["opencode"] == [_user_home / ".config" / "opencode" / "opencode.json"]
    assert paths["kilo"] == [_user_home / ".config" / "kilo" / "kilo.json"]
    assert paths["codex"] == [_user_home / ".codex" / "config.toml"]
    assert paths["hermes"] == [_user_home / ".hermes" / "config.yaml"]
    assert paths["openclaw"] == [_user_home / ".openclaw" / "openclaw.json"]
    assert paths["aider"] == [_user_home / ".aider.conf.yml"]


def test_not_installed_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH
    with pytest.raises(LocalsError, match="npm install -g @anthropic-ai/claude-code"):
        launcher.check_runnable(get_tool("claude"))


def _script(folder: Path, name: str, output: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\necho '{output}'\n")
    path.chmod(0o755)


def test_openclaw_needs_a_newer_node(monkeypatch, tmp_path):
    _script(tmp_path, "node", "v20.20.2")
    _script(tmp_path, "openclaw", "2026.11.1")
    monkeypatch.setenv("PATH", str(tmp_path))
    found = get_tool("openclaw").detect()
    assert found.installed and found.problem == "needs node >= 24; this machine has node 20"
    with pytest.raises(LocalsError, match="OpenClaw needs node >= 24"):
        launcher.check_runnable(get_tool("openclaw"))
    _script(tmp_path, "node", "v24.1.0")
    assert get_tool("openclaw").detect().usable


def test_editor_settings(tmp_path):
    settings = get_tool("editor").settings(ctx_for(tmp_path))
    assert settings == {"Base URL": BASE + "/v1", "API key": "locals", "Model": "locals/smollm2",
                        "Context window": "8192"}


def test_hermes_refuses_a_short_window_before_starting(tmp_path):
    with pytest.raises(LocalsError, match="at least 64,000 tokens of context; smollm2 has 8,192"):
        launcher.check_context(get_tool("hermes"), ctx_for(tmp_path))
    launcher.check_context(get_tool("hermes"), ctx_for(tmp_path, context_length=131072))
    launcher.check_context(get_tool("opencode"), ctx_for(tmp_path, context_length=16384))


@pytest.mark.parametrize("name, fits_in", [("claude", 16384), ("opencode", 16384), ("kilo", 16384),
                                           ("codex", 16384), ("cline", 8192), ("aider", 8192)])
def test_a_first_prompt_that_leaves_no_room_for_a_reply_is_refused_before_starting(tmp_path, name, fits_in):
    tool = get_tool(name)
    launcher.check_context(tool, ctx_for(tmp_path, context_length=fits_in))
    launcher.check_context(tool, ctx_for(tmp_path, context_length=None))  # a server that does not say
    if fits_in > 8192:
        with pytest.raises(LocalsError, match=rf"first prompt alone .* is about {tool.first_prompt:,} tokens;"
                                              rf".*`locals launch {name} --model qwen`"):
            launcher.check_context(tool, ctx_for(tmp_path, context_length=fits_in // 2))


def test_a_tool_refusing_the_window_is_told_in_the_command_that_was_run(tmp_path):
    hermes = get_tool("hermes")
    small = ctx_for(tmp_path, context_length=16384)
    with pytest.raises(LocalsError, match=r"`locals setup hermes --model qwen`"):
        launcher.check_context(hermes, small, accepted_only=True)  # as `locals setup` checks it
    with pytest.raises(LocalsError, match=r"`locals launch hermes --model qwen`"):
        launcher.check_context(hermes, small)


def test_a_long_first_prompt_shrinks_the_reply_room_so_the_tool_starts_on_the_embedded_window(tmp_path):
    # Kilo Code's 12,508-token first prompt in 16,384: a quarter (4,096) would leave no room for its
    # turns; half of the 3,876 left goes to the reply, the rest to the turns before it compacts.
    kilo = get_tool("kilo")
    launcher.check_context(kilo, ctx_for(tmp_path, context_length=16384))
    config = json.loads(kilo.env(ctx_for(tmp_path, context_length=16384))["KILO_CONFIG_CONTENT"])
    assert config["provider"]["locals"]["models"]["smollm2"]["limit"] == {"context": 16384, "output": 1938}
    assert LaunchContext.reply_tokens(16384, get_tool("opencode").first_prompt) == 4096  # a quarter still fits
    assert LaunchContext.reply_tokens(32768, kilo.first_prompt) == 8192
    claude = get_tool("claude")  # 12,333 tokens as served on 16,384: half of the 4,051 left
    assert LaunchContext.reply_tokens(16384, claude.first_prompt) == 2025
    assert LaunchContext.first_prompt_fits(16384, claude.first_prompt)
    assert LaunchContext.reply_tokens(16384, 20231) == MIN_REPLY  # all 21 tools whole: too little room
    assert not LaunchContext.first_prompt_fits(16384, 20231)
