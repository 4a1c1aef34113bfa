"""The agents' fixed tool set: JSON schemas offered to the server and their execution,
confined to one worktree (paths cannot leave it; `run` goes through the sandbox).
"""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.sandbox import Sandbox, cap_text, run_confined

SKIP_DIRS = {".git", "__pycache__", "node_modules", ".venv", "venv", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
READ_CAP = 16_000
# Files a task names go into the first prompt up to these sizes (a small model's window is 8k
# tokens); bigger ones the agent reads itself.
NAMED_FILES, NAMED_FILE_BYTES, NAMED_FILES_BYTES = 4, 3_000, 6_000
EDIT_MAX_BYTES = 4_000_000  # edit_file reads the whole file: past this, `run` with sed or a script
LIST_CAP = 400
SEARCH_CAP = 80


def _fn(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": list(properties),
                "additionalProperties": False,
            },
        },
    }


_STR = {"type": "string"}
TOOL_SCHEMAS: dict[str, dict[str, Any]] = {
    "list_files": _fn("list_files", "List the files under a folder of the project ('.' for all).", {"path": _STR}),
    "read_file": _fn("read_file", "Read a text file of the project.", {"path": _STR}),
    "search": _fn("search", "Find lines matching a regular expression in the project's files.", {"pattern": _STR}),
    "write_file": _fn("write_file", "Create or overwrite a file with the given content.", {"path": _STR, "content": _STR}),
    "edit_file": _fn(
        "edit_file",
        "Replace one exact occurrence of old_text with new_text in a file.",
        {"path": _STR, "old_text": _STR, "new_text": _STR},
    ),
    "run": _fn("run", "Run a shell command in the project folder (no network) and see its output.", {"command": _STR}),
    "finish": _fn("finish", "Stop working and give a short summary (or the answer to the question).", {"summary": _STR}),
}

WRITE_TOOLS = ["list_files", "read_file", "search", "write_file", "edit_file", "run", "finish"]
READ_TOOLS = ["list_files", "read_file", "search", "finish"]


def tool_schemas(names: list[str], network: bool = False) -> list[dict[str, Any]]:
    """The schemas of `names`; `run` says whether its commands reach the network (`--network`)."""
    schemas = [TOOL_SCHEMAS[name] for name in names]
    if network and "run" in names:
        schemas[names.index("run")] = _fn("run", "Run a shell command in the project folder and see its output.",
                                          {"command": _STR})
    return schemas


class ToolInputError(ValueError):
    """A call whose arguments cannot be executed (bad path, missing text); shown to the agent."""


@dataclass
class ToolOutcome:
    """What a call returns to the agent; `finished` is set by `finish`, `changed` by writes."""

    text: str
    ok: bool = True
    finished: bool = False
    changed: bool = False


class Toolbox:
    """Executes tool calls inside `root`; `run` commands go through `sandbox`."""

    def __init__(self, root: Path, sandbox: Sandbox, names: list[str], run_timeout_s: float = 120.0):
        self.root = root.resolve()
        self.sandbox = sandbox
        self.names = names
        self.run_timeout_s = run_timeout_s

    async def execute(self, name: str, args: dict[str, Any]) -> ToolOutcome:
        if name not in self.names:
            return ToolOutcome(f"unknown tool {name!r}; use one of {', '.join(self.names)}", ok=False)
        try:
            if name == "run":
                return await self._run(_arg(args, "command"))
            return await asyncio.to_thread(getattr(self, "_" + name), args)  # file work off the event loop
        except ToolInputError as exc:
            return ToolOutcome(f"error: {exc}", ok=False)
        except OSError as exc:
            return ToolOutcome(f"error: {exc.strerror or exc}", ok=False)
        except ValueError as exc:  # a NUL in a path, text no file encoding can hold: the agent's mistake
            return ToolOutcome(f"error: {exc}", ok=False)

    def resolve(self, rel: str, *, for_write: bool = False) -> Path:
        """`rel` inside the worktree, refusing escapes (.., absolute paths, symlinks) and .git."""
        rel = rel.strip() or "."
        candidate = Path(rel) if os.path.isabs(rel) else self.root / rel
        path = candidate.resolve()
        if path != self.root and self.root not in path.parents:
            raise ToolInputError(f"{rel} is outside the project")
        inside = path.relative_to(self.root).parts
        if inside and inside[0] == ".git":
            raise ToolInputError(".git is off limits")
        if for_write and path == self.root:
            raise ToolInputError("give a file path")
        return path

    def named_files(self, text: str, names: list[str]) -> list[tuple[str, str]]:
        """The small text files among `names` that `text` names by path (or by a file name only
        one of them has), with their contents: put in the first prompt, as Aider adds the files a
        message mentions, so reading them costs the agent no step. Past NAMED_FILE_BYTES a file
        is left for the agent to read; symlinks, non-files and binary files are never attached."""
        bases: dict[str, list[str]] = {}
        for name in names:
            bases.setdefault(os.path.basename(name), []).append(name)
        wanted = [n for n in names if _mentions(text, n)]
        wanted += [hits[0] for base, hits in bases.items()
                   if len(hits) == 1 and "." in base and hits[0] not in wanted and _mentions(text, base)]
        attached, total = [], 0
        for name in wanted[:NAMED_FILES]:
            try:
                path = self._regular_file({"path": name})
                if (self.root / name).is_symlink() or path.stat().st_size > NAMED_FILE_BYTES:
                    continue
                content = path.read_bytes().decode("utf-8")
            except (ToolInputError, OSError, UnicodeDecodeError, ValueError):
                continue
            if total + len(content) > NAMED_FILES_BYTES:
                break
            attached.append((name, content))
            total += len(content)
        return attached

    def _list_files(self, args: dict[str, Any]) -> ToolOutcome:
        base = self.resolve(str(args.get("path") or "."))
        if base.is_file():
            raise ToolInputError(f"{args.get('path')} is a file, not a folder: read it with read_file")
        if not base.is_dir():
            raise ToolInputError(f"{args.get('path')} is not a folder")
        files = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            files += [os.path.relpath(os.path.join(dirpath, f), self.root) for f in sorted(filenames)]
            if len(files) > LIST_CAP:
                files = files[:LIST_CAP] + ["... (more files not shown)"]
                break
        return ToolOutcome("\n".join(files) or "(no files)")

    def _read_file(self, args: dict[str, Any]) -> ToolOutcome:
        path = self._regular_file(args)
        size = path.stat().st_size
        if size <= 2 * READ_CAP:
            return ToolOutcome(cap_text(path.read_text(errors="replace"), READ_CAP) or "(empty file)")
        with open(path, "rb") as f:  # only the head and the tail of a big file are read, as shown
            head = f.read(READ_CAP // 2)
            f.seek(size - READ_CAP // 2)
            tail = f.read()
        return ToolOutcome(f"{head.decode(errors='replace')}\n... ({size - len(head) - len(tail)} bytes cut) ...\n"
                           f"{tail.decode(errors='replace')}")

    def _regular_file(self, args: dict[str, Any], missing: str = "does not exist", for_write: bool = False) -> Path:
        """The file `args["path"]` names, refusing what is not a regular file (a FIFO would block)."""
        path = self.resolve(_arg(args, "path"), for_write=for_write)
        if not path.exists():
            raise ToolInputError(f"{args['path']} {missing}")
        if not path.is_file():
            raise ToolInputError(f"{args['path']} is not a regular file")
        return path

    def _search(self, args: dict[str, Any]) -> ToolOutcome:
        pattern = _arg(args, "pattern")
        try:
            regex = re.compile(pattern)
        except re.error:
            regex = re.compile(re.escape(pattern))
        hits = []
        for path in self._text_files():
            try:
                lines = path.read_text(errors="strict").splitlines()
            except (UnicodeDecodeError, OSError):
                continue
            rel = path.relative_to(self.root)
            hits += [f"{rel}:{i}: {line.strip()[:200]}" for i, line in enumerate(lines, 1) if regex.search(line)]
            if len(hits) >= SEARCH_CAP:
                return ToolOutcome("\n".join(hits[:SEARCH_CAP]) + "\n... (more matches not shown)")
        return ToolOutcome("\n".join(hits) or "no match")

    def _text_files(self):
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            for name in sorted(filenames):
                path = Path(dirpath) / name
                # Symlinks may point outside the worktree; huge files are rarely source.
                if not path.is_symlink() and path.is_file() and path.stat().st_size <= 1_000_000:
                    yield path

    def _write_file(self, args: dict[str, Any]) -> ToolOutcome:
        path = self.resolve(_arg(args, "path"), for_write=True)
        content = args.get("content")
        if not isinstance(content, str):
            raise ToolInputError("content must be a string")
        if path.exists() and not path.is_file():
            raise ToolInputError(f"{args['path']} exists and is not a regular file")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        return ToolOutcome(f"wrote {path.relative_to(self.root)} ({len(content)} characters)", changed=True)

    def _edit_file(self, args: dict[str, Any]) -> ToolOutcome:
        old, new = _arg(args, "old_text"), args.get("new_text")
        if not isinstance(new, str):
            raise ToolInputError("new_text must be a string")
        path = self._regular_file(args, "does not exist; use write_file to create it", for_write=True)
        if path.stat().st_size > EDIT_MAX_BYTES:
            raise ToolInputError(f"{args['path']} is over {EDIT_MAX_BYTES // 1_000_000} MB; change it with `run` "
                                 "(sed, a script)")
        text = path.read_text(errors="surrogateescape")  # bytes that are not UTF-8 are written back as they were
        count = text.count(old)
        if count != 1:
            where = "not found" if count == 0 else f"found {count} times; include more context"
            raise ToolInputError(f"old_text {where} in {args['path']}")
        path.write_text(text.replace(old, new, 1), errors="surrogateescape")
        return ToolOutcome(f"edited {path.relative_to(self.root)}", changed=True)

    async def _run(self, command: str) -> ToolOutcome:
        result = await run_confined(command, self.root, self.sandbox, timeout_s=self.run_timeout_s)
        status = "timed out" if result.timed_out else f"exit code {result.returncode}"
        # A command may have written files: the runner re-checks the diff, so report it as a change.
        return ToolOutcome(f"{status}\n{result.output}", ok=result.ok, changed=True)

    def _finish(self, args: dict[str, Any]) -> ToolOutcome:
        return ToolOutcome(str(args.get("summary") or ""), finished=True)


def _mentions(text: str, name: str) -> bool:
    """Whether `text` names `name` as a whole path (`calc.py`, `calc.py?`, not `mycalc.py`)."""
    return re.search(rf"(?<![\w./-]){re.escape(name)}(?![\w/-]|\.\w)", text) is not None


def _arg(args: dict[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str) or not value:
        raise ToolInputError(f"missing argument {key!r}")
    return value
