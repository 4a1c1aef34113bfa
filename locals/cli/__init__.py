"""The `locals` command: a typer app whose subcommands live one group per module.

Each module in COMMAND_MODULES exposes `register(app)`; a command exists in `--help`
only once its module is listed here and works.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import typer

app = typer.Typer(
    name="locals",
    help="Run teams of coding agents on your own machine, fast.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Order of `--help`: the server first, then agents and tools, then the model alone.
COMMAND_MODULES = [
    "locals.cli.daemon",
    "locals.cli.launch",
    "locals.cli.run",
    "locals.cli.generate",
    "locals.cli.bench",
    "locals.cli.cache",
    "locals.cli.tune",
]

for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def _version(value: bool) -> None:
    if not value:
        return
    from locals.cli.version import print_version

    print_version()
    raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Show version, backend, BLAS, device and memory."),
) -> None:
    """Run teams of coding agents on your own machine, fast."""


def main() -> None:
    """Console entry point: user-facing errors print one line and exit 1."""
    from rich.markup import escape

    from locals.cli.common import console_err
    from locals.config import unusable_folder
    from locals.errors import LocalsError

    try:
        app()
    except LocalsError as exc:
        console_err.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True, highlight=False)
        sys.exit(1)
    except OSError as exc:
        if not _in_data_folders(exc.filename):
            raise  # not about locals' own files: a bug, with its traceback
        console_err.print(f"[red]error:[/red] {escape(unusable_folder(exc.filename, exc))}",
                          soft_wrap=True, highlight=False)
        sys.exit(1)


def _in_data_folders(filename) -> bool:
    """Whether a failed path is one of locals' own files (state, cache, logs, config)."""
    from locals.config import data_roots

    if not isinstance(filename, (str, os.PathLike)):
        return False
    path = Path(filename).absolute()
    return any(path == root.absolute() or root.absolute() in path.parents for root in data_roots())
