"""`locals cache list|clear`: the prompt KV and compiled constraint automata kept on disk across restarts."""

from __future__ import annotations

import shutil

import typer
from rich.table import Table

from locals.cli.common import console
from locals.config import cache_dir

cache_app = typer.Typer(help="Show or clear the prompt cache (and compiled tool/schema automata) kept on disk.",
                        no_args_is_help=True)


def prompts_dir():
    """Where prefix KV files live, one folder per model key."""
    return cache_dir() / "prompts"


@cache_app.command("list")
def list_cache() -> None:
    """List cached prompt prefixes, one a row: model key, tokens, size, last use."""
    import datetime

    from locals.engine.cache.disk_cache import read_header

    root = prompts_dir()
    table = Table(title=f"Prompt cache ({root})")
    for col in ("model key", "tokens", "size", "last used"):
        table.add_column(col)
    total = 0
    for path in sorted(root.glob("*/*.kv")) if root.exists() else []:
        header = read_header(path, None)
        tokens = header.get("tokens") if header else None
        stat = path.stat()
        total += stat.st_size
        used = datetime.datetime.fromtimestamp(stat.st_mtime).strftime("%Y-%m-%d %H:%M")
        # A damaged file is never loaded (its checksum fails); it is listed so `clear` can free it.
        count = str(len(tokens)) if isinstance(tokens, list) else "[yellow]damaged[/yellow]"
        table.add_row(path.parent.name, count, f"{stat.st_size / 2**20:.1f} MiB", used)
    console.print(table)
    automata, automata_bytes = _folder_size(_automata_dir())
    console.print(f"{total / 2**20:.1f} MiB of prompts; compiled tool/schema automata: {automata} files, "
                  f"{automata_bytes / 2**20:.1f} MiB ({_automata_dir()})")


def _automata_dir():
    from locals.config import constraint_dir  # not the compiler: it imports MLX (seconds)

    return constraint_dir()


def _folder_size(root) -> tuple[int, int]:
    """(files, bytes) under `root`, (0, 0) when it does not exist."""
    files = [p for p in root.rglob("*") if p.is_file()] if root.exists() else []
    return len(files), sum(p.stat().st_size for p in files)


@cache_app.command("clear")
def clear_cache() -> None:
    """Delete every cached prompt prefix and compiled automaton (the server rebuilds what it needs)."""
    size = 0
    for root in (prompts_dir(), _automata_dir()):
        size += _folder_size(root)[1]
        shutil.rmtree(root, ignore_errors=True)
    console.print(f"cleared {size / 2**20:.1f} MiB")


def register(app: typer.Typer) -> None:
    app.add_typer(cache_app, name="cache")
