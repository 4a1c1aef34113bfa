"""Change a tool's own config file so it can be given back: backup, manifest, key-level undo.

`apply` records, per file, whether it existed, its hash before, the hash we wrote and
each key's previous value. `revert` restores the backup byte for byte when the file is
still what we wrote; when the user edited it since, it undoes only our keys. JSON(C),
JSON5, TOML and YAML are edited without losing the user's comments.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import tomlkit
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

from integrations import jsonc
from locals.config import config_dir
from locals.errors import LocalsError

MISSING = jsonc.MISSING
KeyPath = tuple[str, ...]


class ConfigFileError(LocalsError):
    """A tool config file that cannot be read, parsed or written."""


JSON_FORMATS = ("json", "json5")


def fmt_of(path: Path, fmt: str | None = None) -> str:
    """The edit format: `fmt` when the tool names one (json5), else by the file name: json (also
    .jsonc), toml or yaml."""
    if fmt is not None:
        return fmt
    suffix = path.suffix.lower()
    if suffix in (".json", ".jsonc"):
        return "json"
    if suffix == ".toml":
        return "toml"
    if suffix in (".yaml", ".yml"):
        return "yaml"
    raise ConfigFileError(f"{path}: unsupported config format {suffix!r}")


def get_value(text: str, fmt: str, path: KeyPath) -> Any:
    """The value at `path` in a document, or MISSING."""
    if fmt in JSON_FORMATS:
        return jsonc.get(text, path, fmt == "json5")
    node: Any = _load_structured(text, fmt)
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return MISSING
        node = node[key]
    return _plain(node)


def set_value(text: str, fmt: str, path: KeyPath, value: Any) -> str:
    """The document with `path` set, creating parent tables/objects; comments kept."""
    if fmt in JSON_FORMATS:
        return jsonc.set_value(text, path, value, fmt == "json5")
    doc = _load_structured(text, fmt)
    node = doc
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = tomlkit.table() if fmt == "toml" else CommentedMap()
        node = node[key]
    node[path[-1]] = value
    return _dump_structured(doc, fmt)


def delete_value(text: str, fmt: str, path: KeyPath, keep: int = 0) -> str:
    """The document without `path`; parents we leave empty are removed too, but for the first `keep`
    (there before us)."""
    if fmt in JSON_FORMATS:
        text = jsonc.delete(text, path, fmt == "json5")
        for depth in range(len(path) - 1, keep, -1):
            if jsonc.get(text, path[:depth], fmt == "json5") == {}:
                text = jsonc.delete(text, path[:depth], fmt == "json5")
        return text
    doc = _load_structured(text, fmt)
    parents = [doc]
    for key in path[:-1]:
        nxt = parents[-1].get(key)
        if not isinstance(nxt, dict):
            return text
        parents.append(nxt)
    comments = _comments_in(parents[-1].get(path[-1])) if fmt == "toml" else []
    parents[-1].pop(path[-1], None)
    for depth in range(len(path) - 1, keep, -1):
        if len(parents[depth]) == 0:
            parents[depth - 1].pop(path[depth - 1], None)
    for comment in comments:  # locals writes no comments: one inside its table is the user's, kept
        doc.add(comment)
    return _dump_structured(doc, fmt)


def _comments_in(node: Any) -> list:
    """The comment lines inside a TOML table (a comment after a table's last key belongs to it)."""
    if not isinstance(node, tomlkit.items.Table):
        return []
    return [item for _, item in node.value.body if isinstance(item, tomlkit.items.Comment)]


def _yaml() -> YAML:
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.indent(mapping=2, sequence=4, offset=2)
    return yaml


def _load_structured(text: str, fmt: str) -> Any:
    try:
        if fmt == "toml":
            return tomlkit.parse(text)
        doc = _yaml().load(text) if text.strip() else None
        return doc if doc is not None else CommentedMap()
    except Exception as exc:  # tomlkit and ruamel raise their own parse error types
        raise ConfigFileError(f"cannot parse the {fmt.upper()} document: {exc}") from exc


def _dump_structured(doc: Any, fmt: str) -> str:
    if fmt == "toml":
        return tomlkit.dumps(doc)
    out = io.StringIO()
    _yaml().dump(doc, out)
    return out.getvalue()


def _plain(node: Any) -> Any:
    """tomlkit/ruamel containers as plain Python values (for comparisons and the manifest)."""
    if hasattr(node, "unwrap"):
        return node.unwrap()
    if isinstance(node, dict):
        return {k: _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return node


# ---- manifest -------------------------------------------------------------------------


@dataclass
class KeyRecord:
    path: list[str]
    written: Any
    before: Any = None
    existed_before: bool = False
    parents_before: int = 0  # how many of its parent objects were there before: undo leaves those


@dataclass
class FileRecord:
    """One file we changed for one tool."""

    tool: str
    path: str
    format: str
    existed: bool
    hash_before: str | None
    hash_written: str
    backup: str | None
    keys: list[KeyRecord] = field(default_factory=list)
    created_dirs: list[str] = field(default_factory=list)  # folders made for it, deepest first


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_path() -> Path:
    return config_dir() / "setup-manifest.json"


def load_manifest() -> list[FileRecord]:
    try:
        raw = json.loads(manifest_path().read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise ConfigFileError(f"{manifest_path()}: unreadable manifest ({exc}); move it aside") from exc
    records = []
    for item in raw.get("files", []):
        keys = [KeyRecord(**k) for k in item.pop("keys", [])]
        records.append(FileRecord(**item, keys=keys))
    return records


def _save_manifest(records: list[FileRecord]) -> None:
    path = manifest_path()
    tmp = path.with_suffix(".tmp")
    _write_private(tmp, json.dumps({"version": 1, "files": [asdict(r) for r in records]}, indent=2).encode())
    tmp.replace(path)


def _write_private(path: Path, data: bytes) -> None:
    """Write a file only its owner reads: backups and the manifest hold the tools' settings, API keys
    among them."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)  # a file that was there keeps its mode otherwise
        f.write(data)


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.locals-tmp")
    tmp.write_bytes(data)
    if path.exists():
        shutil.copymode(path, tmp)
    os.replace(tmp, path)


def _backup(tool: str, path: Path, data: bytes) -> str:
    folder = config_dir() / "backups" / tool
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = folder / f"{time.strftime('%Y%m%d-%H%M%S')}-{path.name}"
    _write_private(target, data)
    return str(target)


NOT_UNDONE = "not undone: "  # how `revert` reports a file it could not give back


def _parse_error(path: Path, fmt: str, exc: Exception, fix: str) -> ConfigFileError:
    reason = exc.args[0] if isinstance(exc, ConfigFileError) and exc.args else exc
    return ConfigFileError(f"{path}: cannot parse it as {fmt.upper()} ({reason}); {fix}")


def check(path: Path, fmt: str | None = None) -> bytes:
    """`path`'s bytes (empty when it does not exist); ConfigFileError, naming the file, when it cannot
    be read or parsed: every file of a tool's setup is checked before any is written, so a setup is
    never left half done."""
    path = path.expanduser().resolve()
    fmt = fmt_of(path, fmt)
    try:
        original = path.read_bytes() if path.exists() else b""
        text = original.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"{path}: cannot read it ({exc})") from exc
    if text.strip():
        try:
            if fmt in JSON_FORMATS:
                jsonc.parse_tree(text, fmt == "json5")
            elif not isinstance(_load_structured(text, fmt), dict):
                raise ConfigFileError("its top level is not a mapping of settings")
        except (ValueError, ConfigFileError) as exc:
            raise _parse_error(path, fmt, exc, "fix the file or move it aside, then run this again") from exc
    if path.exists() and not path.stat().st_mode & 0o222:  # root could write it: the mode says not to
        raise ConfigFileError(f"{path}: it is read-only; make it writable (`chmod u+w {path}`) to let locals "
                              "change it, then run this again")
    return original


def apply(tool: str, path: Path, values: dict[KeyPath, Any], fmt: str | None = None) -> FileRecord:
    """Set `values` in `path` for `tool`, backing the file up and recording the change."""
    path = path.expanduser().resolve()
    fmt = fmt_of(path, fmt)
    records = load_manifest()
    record = next((r for r in records if r.tool == tool and r.path == str(path)), None)
    existed = path.exists()
    original = check(path, fmt)
    text = original.decode("utf-8")
    if record is None:
        record = FileRecord(tool, str(path), fmt, existed, _sha(original) if existed else None, "",
                            _backup(tool, path, original) if existed else None,
                            created_dirs=[str(d) for d in _missing_dirs(path.parent)])
        records.append(record)
    known = {tuple(k.path): k for k in record.keys}
    for key_path, value in values.items():
        key_path, value, parents = _widened(text, fmt, key_path, value)
        if key_path not in known:  # a second setup keeps the value from before the first
            before = get_value(text, fmt, key_path) if text.strip() else MISSING
            known[key_path] = KeyRecord(list(key_path), value, None if before is MISSING else before,
                                        before is not MISSING, parents)
        known[key_path].written = value
        text = set_value(text, fmt, key_path, value)
    record.keys = list(known.values())
    data = text.encode("utf-8")
    _write_atomic(path, data)
    record.hash_written = _sha(data)
    _save_manifest(records)
    return record


def _widened(text: str, fmt: str, path: KeyPath, value: Any) -> tuple[KeyPath, Any, int]:
    """Where a write to `path` really lands, and how many parent objects are there already: a
    parent that holds a plain value (OpenClaw's `agents.defaults.model: "x"`) is replaced whole,
    so that parent is what is recorded, and undone to its value."""
    for depth in range(1, len(path)):
        held = get_value(text, fmt, path[:depth]) if text.strip() else MISSING
        if held is MISSING:
            return path, value, depth - 1
        if not isinstance(held, dict):
            nested: Any = value
            for key in reversed(path[depth:]):
                nested = {key: nested}
            return path[:depth], nested, depth - 1
    return path, value, len(path) - 1


def _missing_dirs(folder: Path) -> list[Path]:
    """`folder` and its parents that do not exist yet, deepest first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def revert(tool: str) -> list[tuple[str, str]]:
    """Undo every change recorded for `tool`; returns (path, what was done) pairs. A file that can
    no longer be parsed is reported as NOT_UNDONE + why, and stays recorded for a later try."""
    records = load_manifest()
    done, kept = [], [r for r in records if r.tool != tool]
    for record in (r for r in records if r.tool == tool):
        try:
            done.append((record.path, _revert_file(record)))
        except ConfigFileError as exc:
            done.append((record.path, NOT_UNDONE + str(exc)))
            kept.append(record)
    _save_manifest(kept)
    return done


# Members a tool rewrites in entries locals wrote, on every run: Cline stamps its provider's
# `updatedAt`. A change there does not make the entry the user's.
BOOKKEEPING = frozenset({"updatedAt"})


def _same_setting(current: Any, written: Any) -> bool:
    """Whether a key still holds what locals wrote, its tool's bookkeeping members aside."""
    if isinstance(current, dict) and isinstance(written, dict):
        keys = (current.keys() | written.keys()) - BOOKKEEPING
        return all(k in current and k in written and _same_setting(current[k], written[k]) for k in keys)
    return current == written


def _revert_file(record: FileRecord) -> str:
    path = Path(record.path)
    if not path.exists():
        return "already removed"
    current = path.read_bytes()
    if _sha(current) == record.hash_written:
        if record.existed and record.backup and Path(record.backup).exists():
            _write_atomic(path, Path(record.backup).read_bytes())
            return "restored from backup"
        if not record.existed:
            path.unlink()
            for folder in map(Path, record.created_dirs):  # deepest first; one holding anything else stays
                if folder.is_dir() and not any(folder.iterdir()):
                    folder.rmdir()
            return "removed (locals created it)"
    try:
        text = current.decode("utf-8")
        for key in record.keys:
            key_path = tuple(key.path)
            if not _same_setting(get_value(text, record.format, key_path), key.written):
                continue  # the user changed this key since: it is theirs now
            if key.existed_before:
                text = set_value(text, record.format, key_path, key.before)
            else:
                text = delete_value(text, record.format, key_path, key.parents_before)
    except (ValueError, ConfigFileError) as exc:
        fix = "fix the file and run `locals disconnect` again" + (
            f", or restore the copy from before setup: {record.backup}" if record.backup else "")
        raise _parse_error(path, record.format, exc, fix) from exc
    _write_atomic(path, text.encode("utf-8"))
    return "removed locals' settings (the file was edited since setup)"
