"""`locals cache list|clear`: the prompt KV, compiled constraint automata, compiled CUDA kernels and
the kernel checks that passed, kept on disk across restarts."""

from __future__ import annotations

import shutil
from pathlib import Path

import typer
from rich.table import Table

from locals import settings
from locals.cli.common import console
from locals.config import cache_dir, kernel_checks_dir, kernels_dir
from locals.errors import LocalsError

cache_app = typer.Typer(help="Show or clear what locals keeps on disk across restarts: the prompt cache, compiled "
                             "tool/schema automata, compiled CUDA kernels and the kernel checks that passed.",
                        no_args_is_help=True)


def prompts_dir():
    """Where prefix KV files live, one folder per model key."""
    return cache_dir() / "prompts"


@cache_app.command("list")
def list_cache() -> None:
    """List cached prompt prefixes, one per row (model key, tokens, size, last use), then the compiled
    automata and CUDA kernels kept."""
    import datetime

    from locals.engine.cache.disk_cache import read_header

    root = prompts_dir()
    table = Table(title=f"Prompt cache ({root})")
    for col in ("model key", "file", "tokens", "size", "last used"):
        table.add_column(col)
    total = 0
    for path in sorted(p for p in root.glob("*/*.kv") if p.is_file()) if root.is_dir() else []:
        header = read_header(path, None)
        stat = path.stat()
        total += stat.st_size
        used = datetime.datetime.fromtimestamp(stat.st_mtime).strftime("%Y-%m-%d %H:%M")
        # A damaged file is never loaded (a server deletes it); it is listed so `clear` can free it.
        count = str(len(header["tokens"])) if header else "[yellow]damaged[/yellow]"
        table.add_row(path.parent.name, path.stem[:12], count, f"{stat.st_size / 2**20:.1f} MiB", used)
    console.print(table)
    automata, automata_bytes = _folder_size(_automata_dir())
    console.print(f"{total / 2**20:.1f} MiB of prompts; compiled tool/schema automata: {automata} files, "
                  f"{automata_bytes / 2**20:.1f} MiB ({_automata_dir()})")
    for folder in _kernel_dirs():
        files, size = _folder_size(folder)
        console.print(f"compiled CUDA kernels: {files} files, {size / 2**20:.1f} MiB ({folder})")
    if kernel_checks_dir().is_dir():
        files = _folder_size(kernel_checks_dir())[0]
        console.print(f"kernel checks passed on this GPU (not run again at a start): {files} "
                      f"file{'' if files == 1 else 's'} ({kernel_checks_dir()})")


def _automata_dir():
    from locals.config import constraint_dir  # not the compiler: it imports MLX (seconds)

    return constraint_dir()


def _folder_size(root) -> tuple[int, int]:
    """(files, bytes) under `root`, (0, 0) when it does not exist."""
    files = [p for p in root.rglob("*") if p.is_file()] if root.exists() else []
    return len(files), sum(p.stat().st_size for p in files)


def _kernel_dirs() -> list[Path]:
    """The compiled CUDA kernels on disk: locals' kernel cache (MLX's kernels and locals' own, a
    folder per MLX version), and locals' own in a kernel folder the user chose (MLX_PTX_CACHE_DIR),
    where MLX's files are the user's. Only those that exist (none on a Mac or a CPU)."""
    chosen = settings.foreign("MLX_PTX_CACHE_DIR")
    folders = [kernels_dir(), Path(chosen) / "locals" if chosen else None]
    return [f for f in folders if f is not None and f.is_dir()]


@cache_app.command("clear")
def clear_cache(
    kernels: bool = typer.Option(False, "--kernels",
                                 help="Also delete the compiled CUDA kernels: the next start on the GPU "
                                      "compiles them again, which takes minutes."),
) -> None:
    """Delete every cached prompt prefix, compiled automaton and kept kernel check (the server rebuilds
    what it needs)."""
    freed, failed = 0, []
    for root in (prompts_dir(), _automata_dir(), kernel_checks_dir(), *(_kernel_dirs() if kernels else [])):
        before = _folder_size(root)[1]
        failed += _remove_tree(root)
        freed += before - _folder_size(root)[1]
    console.print(f"cleared {freed / 2**20:.1f} MiB")
    kept = sum(_folder_size(folder)[1] for folder in _kernel_dirs())
    if kept:
        console.print(f"kept {kept / 2**20:.1f} MiB of compiled CUDA kernels (`locals cache clear --kernels` "
                      "deletes them too; the next start compiles them again)")
    if failed:
        raise LocalsError(f"could not delete {len(failed)} cache path{'s' if len(failed) > 1 else ''} (first: "
                          f"{failed[0]}); make the cache folder writable and run `locals cache clear` again")


def _remove_tree(root: Path) -> list[str]:
    """Delete `root` and everything in it as far as allowed; the paths that could not go."""
    failed: list[str] = []

    def note(_function, path, exc_info) -> None:
        if not isinstance(exc_info[1], FileNotFoundError):  # gone meanwhile is gone
            failed.append(path)

    if root.is_symlink() or root.is_file():  # a file where the folder belongs: it goes too
        try:
            root.unlink()
        except OSError:
            failed.append(str(root))
    elif root.exists():
        shutil.rmtree(root, onerror=note)  # `onexc` from 3.12 on; 3.11 is supported
    return failed


def register(app: typer.Typer) -> None:
    app.add_typer(cache_app, name="cache")
