"""`locals cache list|clear`: the prompt KV that locals keeps on disk across restarts."""

from __future__ import annotations

import shutil

import typer
from rich.table import Table

from locals.cli.common import console
from locals.config import cache_dir

cache_app = typer.Typer(help="Show or clear the prompt cache kept on disk.", no_args_is_help=True)


def prompts_dir():
    """Where prefix KV files live, one folder per model key."""
    return cache_dir() / "prompts"


@cache_app.command("list")
def list_cache() -> None:
    """List cached prompt prefixes, one a row: model key, tokens, size, last use."""
    import datetime

    from locals.engine.disk_cache import read_header

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
    console.print(f"{total / 2**20:.1f} MiB in all")


@cache_app.command("clear")
def clear_cache() -> None:
    """Delete every cached prompt prefix (the daemon rebuilds what it needs)."""
    root = prompts_dir()
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root.exists() else 0
    shutil.rmtree(root, ignore_errors=True)
    console.print(f"cleared {size / 2**20:.1f} MiB")


def register(app: typer.Typer) -> None:
    app.add_typer(cache_app, name="cache")
