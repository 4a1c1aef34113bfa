"""`locals code`, `locals launch`, `locals setup`, `locals disconnect`: agent tools on locals.

The commands start the daemon when needed, ask it what it serves, and hand the tool
modules in integrations/ a LaunchContext; the tools' own files change only through
integrations.configfiles (backup + manifest).
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from locals.cli.common import console, console_err
from locals.client import ensure_server
from locals.config import state_dir
from locals.errors import LocalsError

_PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


def _context(tool, model: Optional[str], port: Optional[int], workdir: Path, task: Optional[str]):
    from integrations.base import LaunchContext
    from integrations.serverinfo import served_model

    with console_err.status("starting locals…", spinner="dots"):  # Ollama's port is not remembered as the user's
        base_url = ensure_server(model, port or tool.port, remember_port=port is not None or tool.port is None)
    name, context_length = served_model(base_url)
    return LaunchContext(base_url, name, context_length, workdir, task, state_dir() / "tools")


def _workdir(directory: Optional[Path]) -> Path:
    path = (directory or Path.cwd()).expanduser().resolve()
    if not path.is_dir():
        raise LocalsError(f"{path} is not a folder; pass the project folder to work in")
    return path


def _keeps_settings(tool) -> bool:
    """Whether `tool` has a config file of its own that `setup` can point at locals."""
    from integrations.base import Tool

    return type(tool).configure is not Tool.configure or type(tool).setup_values is not Tool.setup_values


def _show_changes(done) -> None:
    for path, why in done:
        console_err.print(f"[dim]{path}: {why} (undo: `locals disconnect`)[/dim]")


def _launch(name: str, args: List[str], model, port, directory, task) -> None:
    from integrations import launcher
    from integrations.base import get_tool

    tool = get_tool(name)
    if not tool.launches and (args or task is not None):
        raise LocalsError(f"locals does not start {tool.title}, it prints the settings to enter there; "
                          "--run and extra arguments have no effect: drop them")
    if tool.port and port is not None and port != tool.port:
        raise LocalsError(f"{tool.title} look on port {tool.port}, where `locals launch {tool.name}` serves; "
                          f"drop --port (`locals start --port {port}` serves on another port)")
    if task is not None and not task.strip():
        raise LocalsError('--run is empty: give the task, e.g. --run "add a test for parse()"')
    if tool.launches:
        launcher.check_runnable(tool)
    else:
        getattr(tool, "check_port", lambda: None)()
    ctx = _context(tool, model, port, _workdir(directory), task)
    if not tool.launches:
        _print_settings(tool, ctx)
        return
    launcher.check_context(tool, ctx)
    launch = launcher.plan(tool, ctx, args)
    _show_changes(launcher.apply_changes(tool, launch.changes))
    launcher.execute(launch, ctx.workdir)


def _print_settings(tool, ctx) -> None:
    console.print(f"[bold]{tool.title}[/bold]: locals is running at {ctx.base_url}")
    table = Table(show_header=False, box=None)
    for key, value in tool.settings(ctx).items():
        table.add_row(f"[cyan]{key}[/cyan]", value)
    console.print(table)


def _status(tool, found) -> str:
    if not tool.launches:
        return "[green]built in[/green]"
    if not found.installed:
        problem = tool.runtime_problem()
        return "[yellow]not installed[/yellow]" + (f" ({problem})" if problem else "")
    if found.problem:
        return f"[red]installed, but {found.problem}[/red]"
    return f"[green]installed[/green] {found.version or ''}".rstrip()


def list_tools() -> None:
    """Print every tool locals can open, with whether it is installed here."""
    from concurrent.futures import ThreadPoolExecutor

    from integrations.base import all_tools

    tools = all_tools()
    with ThreadPoolExecutor(max_workers=8) as pool:  # each detect runs `TOOL --version`
        found = list(pool.map(lambda t: t.detect(), tools))
    table = Table(title="Tools for `locals launch TOOL`")
    for column in ("Tool", "Name", "Status", "API", "Install"):
        table.add_column(column, no_wrap=column in ("Tool", "Install"))  # names and commands stay whole
    for tool, detection in zip(tools, found):
        table.add_row(tool.name, tool.title, _status(tool, detection),
                      tool.api if tool.launches else "-", tool.install or "-")
    # Piped, the table is not cut to 80 columns: install commands stay whole, to copy.
    (console if console.is_terminal else Console(width=max(console.width, 160))).print(table)


def _setup(tool: str, model: Optional[str], port: Optional[int]) -> None:
    """Write locals into `tool`'s own settings, backed up first; refused before any server starts."""
    from integrations import launcher
    from integrations.base import get_tool

    target = get_tool(tool)
    if not _keeps_settings(target):  # refuse before a server is started for nothing
        raise LocalsError(f"{target.title}: no settings file of its own for setup to change; "
                          f"use `locals launch {target.name}`")
    if target.launches and not target.detect().installed:
        console_err.print(f"[yellow]{target.title} is not installed here[/yellow]; its settings are written for "
                          f"when it is ({target.install or 'see its own site'})")
    ctx = _context(target, model, port, Path.cwd(), None)
    launcher.check_context(target, ctx, accepted_only=True)  # a setting the tool itself would refuse
    changes = target.configure(ctx) + target.setup_values(ctx)
    if not changes:
        raise LocalsError(f"{target.title}: no settings file of its own for setup to change; "
                          f"use `locals launch {target.name}`")
    for path, why in dict.fromkeys(launcher.apply_changes(target, changes)):  # one line for a change made twice
        console.print(f"[green]✓[/green] {path}: {why}")
    console.print(f"`locals disconnect {target.name}` puts the old settings back (a file that existed was "
                  "backed up first).")


def register(app: typer.Typer) -> None:
    @app.command("code")
    def code(
        directory: Optional[Path] = typer.Argument(None, help="Project folder (default: here)."),
        run: Optional[str] = typer.Option(None, "--run", help="Do this one task headless and print what was done."),
        model: Optional[str] = typer.Option(None, "--model", "-m", help="Model to start locals with."),
        port: Optional[int] = typer.Option(None, "--port", min=1, max=65535,
                                           help="Port of the locals daemon (default: the last one, else 8321)."),
    ) -> None:
        """Open OpenCode on a project, with locals as its model."""
        _launch("opencode", [], model, port, directory, run)

    @app.command("launch", context_settings=_PASSTHROUGH)
    def launch(
        tool: str = typer.Argument(..., help="Tool name, or `list` to show them all."),
        args: Optional[List[str]] = typer.Argument(None, help="Extra arguments passed to the tool."),
        model: Optional[str] = typer.Option(None, "--model", "-m", help="Model to start locals with."),
        port: Optional[int] = typer.Option(None, "--port", min=1, max=65535,
                                           help="Port of the locals daemon (default: the last one, else 8321)."),
        directory: Optional[Path] = typer.Option(None, "--dir", help="Folder to run the tool in."),
        run: Optional[str] = typer.Option(None, "--run", help="Do this one task headless, then exit."),
    ) -> None:
        """Connect an agent tool to locals and start it (`locals launch list` shows them)."""
        if tool == "list":
            list_tools()
            return
        _launch(tool, args or [], model, port, directory, run)

    @app.command("setup")
    def setup(
        tool: str = typer.Argument("opencode", help="Tool whose own config should use locals."),
        model: Optional[str] = typer.Option(None, "--model", "-m", help="Model to start locals with."),
        port: Optional[int] = typer.Option(None, "--port", min=1, max=65535,
                                           help="Port of the locals daemon (default: the last one, else 8321)."),
    ) -> None:
        """Make locals a tool's default model in its own config (undo with `locals disconnect`)."""
        _setup(tool, model, port)

    @app.command("disconnect")
    def disconnect(tool: str = typer.Argument(..., help="Tool to give its own settings back.")) -> None:
        """Undo `locals setup` (and a launch's first-run answers) for a tool."""
        from integrations import configfiles
        from integrations.base import get_tool

        target = get_tool(tool)
        done = configfiles.revert(target.name)
        if not done:
            console.print(f"locals changed nothing of {target.title}'s; nothing to undo")
        for path, what in done:
            mark = "[red]✗[/red]" if what.startswith(configfiles.NOT_UNDONE) else "[green]✓[/green]"
            console.print(f"{mark} {path}: {what}")
        if any(what.startswith(configfiles.NOT_UNDONE) for _, what in done):
            raise typer.Exit(1)
