"""`locals --help` and the docs agree: every command and option the CLI has is on its docs
page, and every `locals CMD --flag` the docs show (README.md, docs/**/*.md) exists. Likewise
every LOCALS_* variable the code reads is in docs/how-it-works.md, and no other is.

The CLI is read from typer's click command tree; a command's page is the docs/*.md whose
title names it (`# \\`locals start\\` and \\`locals stop\\``).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer.main

from locals.cli import app

from tests.helpers.repo import REPO

DOCS = REPO / "docs"
DOC_FILES = [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]
FLAG = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")
# Tokens that end a command line in a snippet: shell operators, `--` (the rest goes to the
# tool `locals launch` starts) and `/` (README's "locals setup X / locals disconnect X").
LINE_END = {"&&", "||", ";", "|", ">", "2>", "--", "/"}
SHELL_LANGS = {"", "sh", "bash", "shell", "console", "text"}


def _commands() -> dict[str, dict]:
    """'start' / 'cache list' / '' (the root) -> {'options': set of flags, 'group': bool}."""
    found: dict[str, dict] = {}

    def walk(command, path: str) -> None:
        flags = {opt for p in command.params if p.param_type_name == "option" and not p.hidden
                 for opt in (*p.opts, *p.secondary_opts)}
        found[path] = {"options": flags, "group": hasattr(command, "commands")}
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}".strip())

    walk(typer.main.get_command(app), "")
    return found


COMMANDS = _commands()


def _pages() -> dict[str, tuple[Path, str]]:
    """Command -> (its page, the page's text), from the pages' titles."""
    pages = {}
    for path in sorted(DOCS.glob("*.md")):
        text = path.read_text()
        title = text.splitlines()[0] if text else ""
        for name in re.findall(r"`locals ([a-z][\w -]*?)`", title):
            pages[name] = (path, text)
    return pages


PAGES = _pages()


def _page_of(command: str) -> tuple[Path, str]:
    top = command.split()[0]
    assert top in PAGES, f"`locals {top}` has no docs page: write docs/{top}.md titled `locals {top}`"
    return PAGES[top]


def _code_lines(text: str) -> list[str]:
    """Shell-ish lines of fenced blocks (continuations joined) and inline code spans."""
    lines = []
    for lang, body in re.findall(r"```(\w*)\n(.*?)```", text, re.DOTALL):
        if lang in SHELL_LANGS:
            lines += body.replace("\\\n", " ").splitlines()
    prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    return lines + re.findall(r"`([^`\n]+)`", prose)


def _invocations(line: str) -> list[tuple[str, list[str]]]:
    """Every `locals …` in a line: (command path, the flags passed to it)."""
    try:
        tokens = shlex.split(line.removeprefix("$ "), comments=True)
    except ValueError:  # an unbalanced quote in prose-like code: fall back to words
        tokens = line.split()
    found = []
    for i, token in enumerate(tokens):
        if token.rsplit("/", 1)[-1] != "locals":
            continue
        command, rest = "", tokens[i + 1:]
        if not rest or re.fullmatch(r"[A-Z][A-Z_]*", rest[0]):  # the bare word; `locals CMD` placeholders
            continue
        while rest and f"{command} {rest[0]}".strip() in COMMANDS and COMMANDS[command]["group"]:
            command, rest = f"{command} {rest[0]}".strip(), rest[1:]
        if rest and not command and re.fullmatch(r"[a-z][\w-]*", rest[0]):
            command = rest[0]  # an unknown command: reported by the test below
        flags = []
        for arg in (a.strip("[]()") for a in rest):  # `[--dir D]` in usage lines
            if arg in LINE_END or arg.rsplit("/", 1)[-1] == "locals":
                break
            flags += FLAG.findall(arg) if arg.startswith("-") else []
        found.append((command, flags))
    return found


def _documented_invocations() -> list[tuple[str, str, str, list[str]]]:
    out = []
    for path in DOC_FILES:
        for line in _code_lines(path.read_text()):
            out += [(path.relative_to(REPO).as_posix(), line, cmd, flags) for cmd, flags in _invocations(line)]
    return out


DOCUMENTED = _documented_invocations()


def _table_flags(text: str) -> list[str]:
    """Flags in the first cell of each table row (the options tables of command pages)."""
    return [flag for row in re.findall(r"^\|([^|\n]*)\|", text, re.MULTILINE) for flag in FLAG.findall(row)]


@pytest.mark.parametrize("command", sorted(c for c in COMMANDS if c))
def test_every_command_is_documented(command):
    path, text = _page_of(command)
    assert f"locals {command}" in text, f"{path.name} never shows `locals {command}`"


def test_docs_show_many_invocations():
    # Guards the parser: if it stopped finding commands, the next test would pass vacuously.
    shown = {cmd for _, _, cmd, _ in DOCUMENTED}
    assert len(shown) >= len(COMMANDS) - 3, sorted(shown)


def test_every_documented_invocation_exists():
    wrong = []
    for where, line, command, flags in DOCUMENTED:
        if command not in COMMANDS:
            wrong.append(f"{where}: `locals {command}` is not a command ({line.strip()})")
            continue
        wrong += [f"{where}: `locals {command}` has no {flag} ({line.strip()})"
                  for flag in flags if flag not in COMMANDS[command]["options"] | {"--help"}]
    assert wrong == []


def _documented_flags(command: str) -> set[str]:
    """Flags its page explains (an options-table row, or a code span that starts with the
    flag) plus those the docs pass to it in a `locals …` example."""
    _, text = _page_of(command)
    spans = [span for span in re.findall(r"`([^`\n]+)`", text) if span.startswith("-")]
    shown = {f for _, _, cmd, flags in DOCUMENTED for f in flags if cmd == command}
    return set(_table_flags(text)) | {f for span in spans for f in FLAG.findall(span)} | shown


@pytest.mark.parametrize("command", sorted(c for c in COMMANDS if c))
def test_every_option_is_documented(command):
    missing = sorted(COMMANDS[command]["options"] - _documented_flags(command))
    path, _ = _page_of(command)
    assert missing == [], f"{path.name} does not document {missing} of `locals {command}`"


def test_root_options_are_documented():
    shown = {f for _, _, cmd, flags in DOCUMENTED for f in flags if cmd == ""}
    assert sorted(COMMANDS[""]["options"] - shown) == [], "show `locals --FLAG` in README.md"


@pytest.mark.parametrize("page", sorted({path.name for path, _ in PAGES.values()}))
def test_every_flag_in_an_options_table_exists(page):
    commands = [c for c in COMMANDS if c and PAGES.get(c.split()[0], (None,))[0] == DOCS / page]
    known = set().union(*(COMMANDS[c]["options"] for c in commands))
    listed = _table_flags((DOCS / page).read_text())
    assert [f for f in listed if f not in known] == [], f"{page} lists options `locals {commands}` lacks"


ENV_VAR = re.compile(r"\bLOCALS_[A-Z][A-Z_]*[A-Z]\b")


def _variables_read() -> set[str]:
    files = [f for package in ("locals", "agents", "integrations") for f in (REPO / package).rglob("*.py")]
    return {name for f in files for name in ENV_VAR.findall(f.read_text())}


def test_every_environment_variable_is_documented():
    documented = set(ENV_VAR.findall((DOCS / "how-it-works.md").read_text()))
    read = _variables_read()
    assert len(read) >= 5  # the scan works
    assert sorted(read - documented) == [], "add them to docs/how-it-works.md (Every setting)"
    examples = {name for f in (DOCS / "examples").iterdir() for name in ENV_VAR.findall(f.read_text())}
    assert sorted(documented - read - examples) == [], "docs/how-it-works.md names variables nothing reads"


def test_how_it_works_lists_every_flag():
    """The flags table of docs/how-it-works.md names exactly each command's options."""
    text = (DOCS / "how-it-works.md").read_text()
    rows = re.findall(r"^\| (`locals[^|]*)\|([^|]*)\|", text, re.MULTILINE)
    covered, wrong = set(), []
    for first, flags in rows:
        spans = re.findall(r"`([^`]+)`", first)
        commands = [_invocations(span)[0][0] if span != "locals" else "" for span in spans]
        covered.update(commands)
        expected = set().union(*(COMMANDS[c]["options"] for c in commands))
        if set(FLAG.findall(flags)) != expected:
            wrong.append(f"{first.strip()}: lists {sorted(set(FLAG.findall(flags)))}, has {sorted(expected)}")
    assert wrong == []
    assert sorted(set(COMMANDS) - covered - {"cache"}) == [], "commands missing from the table"
