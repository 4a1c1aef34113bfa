"""Helpers shared by CLI commands: consoles, loading a model with a spinner, fast BLAS."""

from __future__ import annotations

from rich.console import Console

# Messages are never cut into lines: a command or URL in one stays whole when piped (the terminal wraps
# what is too wide for it); tables still fit the width.
console = Console(soft_wrap=True)
console_err = Console(stderr=True, soft_wrap=True)


def progress_bar():
    """The bar long commands show on stderr: the current step, a bar, done of total, time taken."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console_err, transient=True)


def prepare_model_process() -> None:
    """Commands that run a model call this first: on Linux it may re-exec with OpenBLAS."""
    from locals.engine.load.backend import reexec_with_fast_blas

    reexec_with_fast_blas()


def load_with_spinner(model: str | None):
    """Load a model (None: this machine's default) while a spinner runs on stderr."""
    from locals.engine.load.models import load_model

    label = model or "the default model"
    with console_err.status(f"loading {label}…", spinner="dots"):
        loaded = load_model(model)
    console_err.print(
        f"[dim]{loaded.name} loaded in {loaded.load_seconds:.1f} s "
        f"({loaded.backend.kind}, {loaded.weights_bytes / 1e6:.0f} MB)[/dim]"
    )
    return loaded


def given(ctx, *names: str) -> list[str]:
    """The options among parameter `names` that the user set (command line or environment), as flags."""
    flags = {p.name: p.opts[0] for p in ctx.command.params}
    # By name: typer carries its own copy of click, whose ParameterSource is not click's.
    return [flags[n] for n in names
            if getattr(ctx.get_parameter_source(n), "name", None) in ("COMMANDLINE", "ENVIRONMENT")]
