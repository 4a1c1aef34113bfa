"""`locals run`: a team of agents on a task in git worktrees, judged by `--check`; without
`--check`, an answer to a question about the project. The work itself lives in agents/.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import signal
from pathlib import Path
from typing import Optional

import typer

from locals.cli.common import console, console_err
from locals.config import state_dir
from locals.errors import LocalsError


def parse_parts(value: str) -> int | None:
    """`auto` -> None (the planner decides), else a positive count."""
    if value == "auto":
        return None
    if value.isdigit() and int(value) >= 1:
        return int(value)
    raise LocalsError(f"--parts must be `auto` or a positive number, not {value!r}")


def run(
    task: str = typer.Argument(..., help="What to do, or a question about the project (without --check)."),
    directory: Path = typer.Option(Path("."), "--dir", "-d", help="The project (a git repository)."),
    check: Optional[str] = typer.Option(None, "--check", help="Shell command that must pass, e.g. 'python3 -m pytest -q'."),
    agents: int = typer.Option(4, "--agents", "-n", min=1, max=64, help="Agents per part, working at once."),
    parts: str = typer.Option("auto", "--parts", help="`auto` (the planner decides) or a number of parts."),
    max_steps: int = typer.Option(12, "--max-steps", min=1, help="Tool calls each agent may make."),
    timeout: float = typer.Option(1800.0, "--timeout", min=1.0, help="Seconds before the whole run stops."),
    max_tokens: int = typer.Option(1024, "--max-tokens", min=16, help="Longest reply of each model call."),
    server: Optional[str] = typer.Option(None, "--server", help="Any OpenAI-compatible base URL instead of the locals daemon."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model to start (or to name to --server)."),
    port: Optional[int] = typer.Option(None, "--port", min=1, max=65535,
                                       help="Port of the locals daemon (default: the last one, else 8321)."),
    keep: bool = typer.Option(False, "--keep", help="Keep the worktrees afterwards (their path is printed)."),
    no_sandbox: bool = typer.Option(False, "--no-sandbox", help="Run the agents' commands unconfined."),
    network: bool = typer.Option(False, "--network", help="Let the agents' commands and the check use the network."),
    json_out: bool = typer.Option(False, "--json", help="Print the outcome as JSON, with no live display."),
) -> None:
    """Let a team of agents do TASK in copies of the project; your tests decide (--check)."""
    from agents.runner import RunOptions

    if not task.strip():
        raise LocalsError('the task is empty: say what to do, e.g. locals run "fix the failing test" --check "pytest -q"')
    if server and port is not None:
        raise LocalsError("--port names the locals daemon; with --server it has no effect: drop one of them")
    options = RunOptions(
        task=task, directory=directory.expanduser().resolve(), check=check, agents=agents,
        parts=parse_parts(parts), max_steps=max_steps, timeout_s=timeout, sandbox=not no_sandbox,
        network=network, keep=keep, max_tokens=max_tokens,
    )
    if parts != "auto" and check is None:
        raise LocalsError("--parts splits a task checked by --check; a question (no --check) is answered whole: "
                          "drop --parts or add --check")
    if not options.directory.is_dir():
        raise LocalsError(f"--dir {directory} is not a folder")
    _preflight(options)
    if server and not server.startswith(("http://", "https://")):
        raise LocalsError(f"--server {server!r}: give the base URL with its scheme, e.g. http://127.0.0.1:8080/v1")
    base_url = server or _start_daemon(model, port)
    exit_code = [130]  # 128 + the signal that stopped the run: SIGINT, or SIGTERM (_main sets 143)
    try:
        report = asyncio.run(_main(options, base_url, model if server else None, json_out, exit_code))
    except (KeyboardInterrupt, asyncio.CancelledError):
        where = (f"worktrees kept under {state_dir() / 'runs'}" if keep else "worktrees removed")
        message = (f"stopped: {where}" if check is None  # a question never changes the project
                   else f"stopped: {where}; unfinished parts left your project as it was")
        if json_out:  # a script reading --json gets JSON on every exit
            console.print_json(json.dumps({"ok": False, "stopped": True, "message": message}))
        console_err.print(f"[yellow]{message}[/yellow]")
        raise typer.Exit(exit_code[0]) from None
    raise typer.Exit(0 if report.ok else 1)


def _preflight(options) -> None:
    """Fail before starting anything when the project or the sandbox cannot work."""
    from agents.sandbox import make_sandbox
    from agents.worktree import open_project

    open_project(options.directory)
    if options.check is not None:
        _check_runnable(options.check, options.directory)
    make_sandbox(options.directory, options.directory, network=options.network, enabled=options.sandbox)


# Words a shell runs itself: a check may start with them without a program on PATH.
_SHELL_WORDS = {"cd", "test", "[", "true", "false", "exit", "export", "set", "source", ".", "eval", "exec",
                "if", "for", "while", "(", "{", "!", "time", "command", "env"}


def _check_runnable(check: str, directory: Path) -> None:
    """Refuse an empty --check, or one whose program is not here, before any agent starts."""
    if not check.strip():
        raise LocalsError("--check is empty: give the command that must pass (e.g. 'python3 -m pytest -q'), "
                          "or leave --check out to ask a question about the code")
    try:
        first = next((w for w in shlex.split(check) if "=" not in w), "")  # skip VAR=value prefixes
    except ValueError:
        raise LocalsError(f"--check {check!r}: its quotes do not close") from None
    if not first or first in _SHELL_WORDS or any(c in first for c in "$`;&|<>"):
        return
    path = directory / Path(first).expanduser()
    found = path.exists() if "/" in first else shutil.which(first) is not None
    if not found:
        raise LocalsError(f"--check: `{first}` is not a command here (not on PATH, nor a file in {directory}); "
                          "fix the name or give its path")
    if "/" in first and (path.is_dir() or not os.access(path, os.X_OK)):
        raise LocalsError(f"--check: `{first}` is not executable; run `chmod +x {first}`, or name its "
                          f"interpreter (`sh {first}`, `python3 {first}`)")


def _start_daemon(model: str | None, port: int | None) -> str:
    from locals.client import ensure_server

    with console_err.status("starting the locals daemon…", spinner="dots"):
        return ensure_server(model, port)


async def _main(options, base_url: str, model: str | None, json_out: bool, exit_code: list[int]):
    from agents.display import LiveDisplay, print_summary
    from agents.events import fan_out
    from agents.report import TeamReporter
    from agents.runner import run_team
    from locals.client import ChatClient

    # SIGTERM cleans up like Ctrl-C: cancelling the main task runs the runner's finally blocks.
    main_task = asyncio.current_task()

    def terminated() -> None:
        exit_code[0] = 128 + signal.SIGTERM
        main_task.cancel()

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, terminated)
    # The server's dashboard shows the team while it works (a server without one is left alone).
    async with ChatClient(base_url, model=model, timeout_s=options.timeout_s) as client, \
            TeamReporter(base_url, options) as reporter:
        if json_out:
            report = await run_team(options, client, reporter)
            reporter.finish(report)
            print(json.dumps(report.to_dict(), indent=2))
            return report
        with LiveDisplay(console_err, options.max_steps, question=options.check is None) as display:
            report = await run_team(options, client, fan_out(display, reporter))
        reporter.finish(report)
    print_summary(console, console_err, report)
    return report


def register(app: typer.Typer) -> None:
    app.command("run")(run)
