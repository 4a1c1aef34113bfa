"""setup → disconnect on real config files: comments survive, user edits after setup are kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomlkit

from integrations import configfiles, jsonc

OPENCODE_JSONC = """{
  // my own settings, keep them
  "$schema": "https://opencode.ai/config.json",
  "theme": "tokyonight", /* the dark one */
  "model": "anthropic/claude-sonnet-4-5",
  "provider": {
    "anthropic": {"options": {"timeout": 600000}},
  },
}
"""

CODEX_TOML = """# Codex settings
model = "gpt-5"  # the default

[model_providers.azure]
name = "Azure"   # work account
base_url = "https://example.invalid/openai"
"""

HERMES_YAML = """# Hermes config
model:
  default: anthropic/claude-sonnet-4  # daily driver
  provider: auto
terminal:
  env_type: local
"""

LOCALS_PROVIDER = {"npm": "@ai-sdk/openai-compatible", "options": {"baseURL": "http://127.0.0.1:8321/v1"}}


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALS_HOME", str(tmp_path / "locals-home"))


def _opencode_values():
    return {("provider", "locals"): LOCALS_PROVIDER, ("model",): "locals/smollm2"}


@pytest.mark.parametrize(
    "name, original, values",
    [
        ("opencode.jsonc", OPENCODE_JSONC, _opencode_values()),
        ("config.toml", CODEX_TOML, {("model_provider",): "locals", ("model",): "smollm2",
                                     ("model_providers", "locals"): {"name": "locals", "wire_api": "responses"}}),
        ("config.yaml", HERMES_YAML, {("model", "provider"): "custom", ("model", "default"): "smollm2",
                                      ("model", "context_length"): 8192}),
    ],
)
def test_setup_then_disconnect_restores_bytes(tmp_path, name, original, values):
    path = tmp_path / name
    path.write_text(original)
    record = configfiles.apply("tool", path, values)
    written = path.read_text()
    assert written != original
    fmt = configfiles.fmt_of(path)
    for key, value in values.items():
        assert configfiles.get_value(written, fmt, key) == value
    assert record.existed and record.backup and record.hash_before != record.hash_written
    assert configfiles.revert("tool") == [(str(path.resolve()), "restored from backup")]
    assert path.read_bytes() == original.encode()
    assert configfiles.load_manifest() == []


def test_setup_keeps_comments_of_the_user(tmp_path):
    path = tmp_path / "opencode.jsonc"
    path.write_text(OPENCODE_JSONC)
    configfiles.apply("opencode", path, _opencode_values())
    text = path.read_text()
    assert "// my own settings, keep them" in text and "/* the dark one */" in text
    assert jsonc.loads(text)["provider"]["anthropic"] == {"options": {"timeout": 600000}}

    toml_path = tmp_path / "config.toml"
    toml_path.write_text(CODEX_TOML)
    configfiles.apply("codex", toml_path, {("model",): "smollm2"})
    assert "# the default" in toml_path.read_text() and "# work account" in toml_path.read_text()


def test_user_edit_after_setup_is_kept_and_only_our_keys_go(tmp_path):
    path = tmp_path / "opencode.jsonc"
    path.write_text(OPENCODE_JSONC)
    configfiles.apply("opencode", path, _opencode_values())
    edited = jsonc.set_value(path.read_text(), ("autoupdate",), False)
    path.write_text(edited.replace('"theme": "tokyonight"', '"theme": "gruvbox"'))

    [(_, what)] = configfiles.revert("opencode")
    assert "edited since setup" in what
    after = path.read_text()
    value = jsonc.loads(after)
    assert value["theme"] == "gruvbox" and value["autoupdate"] is False  # the user's edits
    assert "locals" not in value["provider"]  # our provider is gone
    assert value["model"] == "anthropic/claude-sonnet-4-5"  # the user's model is back
    assert "// my own settings, keep them" in after
    # Apart from the user's two edits, the file is what it was before setup.
    expected = jsonc.set_value(OPENCODE_JSONC, ("autoupdate",), False).replace("tokyonight", "gruvbox")
    assert after == expected


def test_a_key_the_user_changed_after_setup_is_theirs(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(HERMES_YAML)
    configfiles.apply("hermes", path, {("model", "default"): "smollm2", ("model", "base_url"): "http://x/v1"})
    text = configfiles.set_value(path.read_text(), "yaml", ("model", "default"), "qwen-by-hand")
    path.write_text(text)
    configfiles.revert("hermes")
    after = path.read_text()
    assert configfiles.get_value(after, "yaml", ("model", "default")) == "qwen-by-hand"
    assert configfiles.get_value(after, "yaml", ("model", "base_url")) is configfiles.MISSING
    assert "# daily driver" in after or "qwen-by-hand" in after


def test_file_created_by_setup_is_removed(tmp_path):
    path = tmp_path / "new" / "settings.json"
    configfiles.apply("claude", path, {("env", "ANTHROPIC_BASE_URL"): "http://127.0.0.1:8321"})
    assert json.loads(path.read_text()) == {"env": {"ANTHROPIC_BASE_URL": "http://127.0.0.1:8321"}}
    [(_, what)] = configfiles.revert("claude")
    assert what.startswith("removed") and not path.exists()
    assert not (tmp_path / "new").exists()  # the folder setup made for it goes too


def test_a_folder_that_holds_the_users_files_stays(tmp_path):
    path = tmp_path / "new" / "deeper" / "settings.json"
    configfiles.apply("claude", path, {("env", "X"): "1"})
    (tmp_path / "new" / "mine.txt").write_text("the user's")
    configfiles.revert("claude")
    assert not (tmp_path / "new" / "deeper").exists() and (tmp_path / "new" / "mine.txt").exists()


def test_undoing_a_nested_key_removes_the_objects_setup_made_for_it(tmp_path):
    path = tmp_path / "opencode.json"
    path.write_text('{"model": "theirs"}\n')
    configfiles.apply("opencode", path, {("provider", "locals", "options", "baseURL"): "http://x/v1"})
    path.write_text(jsonc.set_value(path.read_text(), ("theme",), "dark"))  # edited since: key-level undo
    configfiles.revert("opencode")
    assert jsonc.loads(path.read_text()) == {"model": "theirs", "theme": "dark"}


@pytest.mark.parametrize("name, broken", [("settings.json", '{ "model": "x", \n'), ("settings.json", '["a list"]'),
                                          ("settings.json", '{"theme": tru, "model": "x"}'),
                                          ("settings.json", "{\"theme\": 'dracula'}"),
                                          ("config.toml", "model = = 1"), ("config.yaml", "a: [1,"),
                                          ("config.yaml", "- a\n- b\n"), ("config.yaml", "just a string\n")])
def test_a_file_that_does_not_parse_stops_setup_before_any_write_and_is_named(tmp_path, name, broken):
    from integrations.launcher import apply_changes
    from integrations.base import ConfigChange, get_tool

    good, bad = tmp_path / "first.json", tmp_path / name
    bad.write_text(broken)
    changes = [ConfigChange(good, {("a",): 1}, "first"), ConfigChange(bad, {("b",): 2}, "second")]
    with pytest.raises(configfiles.ConfigFileError) as raised:
        apply_changes(get_tool("claude"), changes)
    assert str(bad.resolve()) in str(raised.value) and "move it aside" in str(raised.value)
    assert not good.exists() and bad.read_text() == broken and configfiles.load_manifest() == []


def test_an_entry_its_tool_restamped_is_still_locals_and_goes(tmp_path):
    path = tmp_path / "providers.json"
    path.write_text('{"version": 1, "lastUsedProvider": "anthropic", "providers": {"anthropic": {"k": 1}}}')
    entry = {"settings": {"baseUrl": "http://127.0.0.1:8321/v1"}, "updatedAt": "2026-01-01T00:00:00Z"}
    configfiles.apply("cline", path, {("lastUsedProvider",): "openai-compatible",
                                      ("providers", "openai-compatible"): entry})
    after_a_run = json.loads(path.read_text())  # Cline rewrites the file and stamps the entry
    after_a_run["providers"]["openai-compatible"]["updatedAt"] = "2026-02-02T00:00:00Z"
    path.write_text(json.dumps(after_a_run, indent=2))
    configfiles.revert("cline")
    back = json.loads(path.read_text())
    assert back["lastUsedProvider"] == "anthropic" and "openai-compatible" not in back["providers"]
    # A setting the user changed inside it is theirs: the entry stays.
    configfiles.apply("cline", path, {("providers", "openai-compatible"): entry})
    mine = json.loads(path.read_text())
    mine["providers"]["openai-compatible"]["settings"]["baseUrl"] = "http://my-server/v1"
    path.write_text(json.dumps(mine))
    configfiles.revert("cline")
    assert json.loads(path.read_text())["providers"]["openai-compatible"]["settings"]["baseUrl"] == "http://my-server/v1"


def test_a_read_only_file_is_refused_before_any_write(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text('{"theme": "dark"}\n')
    path.chmod(0o444)
    with pytest.raises(configfiles.ConfigFileError, match="read-only; make it writable"):
        configfiles.apply("claude", path, {("env", "X"): "1"})
    assert path.read_text() == '{"theme": "dark"}\n' and configfiles.load_manifest() == []


def test_backups_and_the_manifest_are_the_users_alone(tmp_path):
    path = tmp_path / ".aider.conf.yml"
    path.write_text("openai-api-key: sk-mysecret\n")
    path.chmod(0o600)
    configfiles.apply("aider", path, {("model",): "openai/smollm2"})
    [record] = configfiles.load_manifest()
    assert Path(record.backup).stat().st_mode & 0o777 == 0o600
    assert Path(record.backup).parent.stat().st_mode & 0o777 == 0o700
    assert configfiles.manifest_path().stat().st_mode & 0o777 == 0o600


def test_a_file_broken_after_setup_is_reported_not_undone_and_kept_for_later(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text('{"theme": "dark"}\n')
    configfiles.apply("claude", path, {("env", "X"): "1"})
    path.write_text('{"env": {"X": "1"}, oops\n')
    [(_, what)] = configfiles.revert("claude")
    assert what.startswith(configfiles.NOT_UNDONE) and "restore the copy from before setup" in what
    assert len(configfiles.load_manifest()) == 1  # a later `disconnect` tries again
    path.write_text('{"theme": "dark", "env": {"X": "1"}}\n')
    [(_, what)] = configfiles.revert("claude")
    assert "edited since setup" in what and jsonc.loads(path.read_text()) == {"theme": "dark"}


def test_second_setup_keeps_the_first_backup(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(CODEX_TOML)
    configfiles.apply("codex", path, {("model",): "smollm2"})
    configfiles.apply("codex", path, {("model",): "other", ("model_provider",): "locals"})
    [record] = configfiles.load_manifest()
    assert {tuple(k.path): k.before for k in record.keys}[("model",)] == "gpt-5"
    configfiles.revert("codex")
    assert path.read_text() == CODEX_TOML


def test_edited_toml_loses_only_our_table(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(CODEX_TOML)
    configfiles.apply("codex", path, {("model_providers", "locals"): {"name": "locals"}, ("model",): "smollm2"})
    path.write_text(path.read_text() + "\n[tui]\nnotifications = true  # mine\n")
    configfiles.revert("codex")
    doc = tomlkit.parse(path.read_text())
    assert doc["model"] == "gpt-5" and "locals" not in doc["model_providers"]
    assert doc["tui"]["notifications"] is True and "# mine" in path.read_text()


def test_a_comment_written_after_our_toml_table_outlives_it(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(CODEX_TOML)
    configfiles.apply("codex", path, {("model_providers", "locals"): {"name": "locals"}})
    path.write_text(path.read_text() + "# remember to try the new model\n")  # TOML files it under our table
    configfiles.revert("codex")
    assert "# remember to try the new model" in path.read_text()
    assert "locals" not in tomlkit.parse(path.read_text())["model_providers"]


def test_unparseable_file_is_a_clear_error(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("model = \n")
    with pytest.raises(configfiles.ConfigFileError, match="TOML"):
        configfiles.apply("codex", path, {("model",): "x"})
    assert path.read_text() == "model = \n"  # untouched


def test_openclaw_setup_reads_and_undoes_its_json5_config(tmp_path, monkeypatch):
    from integrations.base import LaunchContext, get_tool
    from integrations.launcher import apply_changes

    config = tmp_path / "openclaw.json"
    original = "{\n  // mine\n  agents: { defaults: { workspace: '~/w' } },\n  gateway: { port: 18789, },\n}\n"
    config.write_text(original)
    monkeypatch.setenv("OPENCLAW_CONFIG_PATH", str(config))
    tool = get_tool("openclaw")
    ctx = LaunchContext(base_url="http://127.0.0.1:8321", model="smollm2", context_length=8192)
    apply_changes(tool, tool.setup_values(ctx))
    written = config.read_text()
    assert "// mine" in written and "workspace: '~/w'" in written
    assert configfiles.get_value(written, "json5", ("agents", "defaults", "model", "primary")) == ctx.provider_model
    config.write_text(written.replace("port: 18789", "port: 18790"))  # the user's edit since
    assert configfiles.revert("openclaw") == [
        (str(config.resolve()), "removed locals' settings (the file was edited since setup)")]
    assert jsonc.loads(config.read_text(), allow_json5=True) == {
        "agents": {"defaults": {"workspace": "~/w"}}, "gateway": {"port": 18790}}


def test_undo_after_the_users_edits_gives_back_a_plain_value_setup_replaced_and_keeps_their_empty_objects(tmp_path):
    path = tmp_path / "openclaw.json"
    path.write_text('{"agents": {"defaults": {"model": "anthropic/claude"}}, "provider": {}, "theme": "dark"}\n')
    configfiles.apply("openclaw", path, {("agents", "defaults", "model", "primary"): "locals/smollm2",
                                         ("provider", "locals"): {"npm": "x"}})
    assert jsonc.get(path.read_text(), ("agents", "defaults", "model")) == {"primary": "locals/smollm2"}
    path.write_text(path.read_text().replace('"dark"', '"light"'))  # the user's edit since: key-level undo
    configfiles.revert("openclaw")
    assert jsonc.loads(path.read_text()) == {"agents": {"defaults": {"model": "anthropic/claude"}}, "provider": {},
                                             "theme": "light"}
