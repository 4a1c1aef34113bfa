"""`locals bench`: how fast this machine serves agents — locals against mlx_lm.server (and
llama.cpp's server where it runs) as fresh server processes on the same weights, driven over
HTTP by agent-shaped traffic, rounds interleaved, every request kept in a JSON report.
`--engine` runs the in-process decode diagnostic instead.

This module holds the command and what both modes share (the quiet-machine check, where the
report goes); bench_traffic.py and bench_engine.py run each mode.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from locals.cli.common import console_err, given
from locals.errors import LocalsError

TRAFFIC = "Served traffic (the default)"
ENGINE = "In-process decode (--engine, a diagnostic)"


def _check_quiet(force: bool) -> float:
    from locals.measure import BUSY_CPU_PERCENT, other_cpu_percent

    busy = other_cpu_percent()
    if busy > BUSY_CPU_PERCENT:
        message = (f"other processes use {busy:.0f}% of the CPU: timings would measure them too. "
                   "Close them (or stop a running `locals serve`), or pass --force to measure anyway")
        if not force:
            raise LocalsError(message)
        console_err.print(f"[bold yellow]warning:[/bold yellow] {message}; the report records it.")
    return busy


def _report_path(out: Path | None) -> Path:
    """Where the JSON report goes: `out`, a new file inside `out` when it is a folder or has no
    suffix (a folder to create: the shell's trailing slash does not reach us), or the state folder."""
    from locals.config import state_dir

    name = f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path = (out / name if out.is_dir() or not out.suffix else out) if out else state_dir() / "bench" / name
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LocalsError(f"--out {out}: cannot create its folder ({exc.strerror}); pick a writable path") from None
    existed = path.exists()
    try:  # a report that cannot be written fails now, not after minutes of measuring
        with open(path, "a"):
            pass
    except OSError as exc:
        raise LocalsError(f"--out {path}: cannot write it ({exc.strerror}); pick a writable path") from None
    if not existed:
        path.unlink()
    return path


def _traffic_plan(agents: str, rounds: int, turns: int, time_scale: float, size_scale: float | None,
                  seed: int, max_minutes: float | None) -> dict:
    from locals.cli.bench_traffic import parse_agents
    from locals.traffic.workload import Workload

    problems = [f"--turns {turns}: use at least 1" if turns < 1 else "",
                f"--time-scale {time_scale:g}: use 0 or more" if time_scale < 0 else "",
                f"--size-scale {size_scale:g}: use more than 0" if size_scale is not None and size_scale <= 0 else ""]
    if any(problems):
        raise LocalsError("; ".join(p for p in problems if p))
    if size_scale is None:  # a CPU reads prompts ~100x slower than a GPU: the same traffic, smaller
        from locals.engine.load.backend import detect

        size_scale = 0.2 if detect().kind == "cpu" else 1.0
    return {"agents": parse_agents(agents), "rounds": rounds, "seed": seed,
            "workload": Workload(turns=turns, size_scale=size_scale, time_scale=time_scale),
            "time_limit_s": max_minutes * 60 if max_minutes else None}


def bench(
    ctx: typer.Context,
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model to measure (default: this machine's)."),
    rounds: int = typer.Option(3, "--rounds", "-r", min=1, help="Rounds (servers interleaved; medians over rounds)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o",
                                       help="Where to write the JSON report: a .json file, or a folder (made if new)."),
    force: bool = typer.Option(False, "--force", help="Measure even when other processes keep the CPU busy."),
    agents: str = typer.Option("1,4,8", "--agents", "-a", rich_help_panel=TRAFFIC,
                               help="Agent counts, comma-separated; one phase each, on each server."),
    turns: int = typer.Option(2, "--turns", rich_help_panel=TRAFFIC, help="Turns per agent before the burst."),
    time_scale: float = typer.Option(0.2, "--time-scale", rich_help_panel=TRAFFIC,
                                     help="Multiplies the agents' 0–10 s tool time and their 10 s staggered start."),
    size_scale: Optional[float] = typer.Option(
        None, "--size-scale", rich_help_panel=TRAFFIC,
        help="Multiplies every prompt and reply length (default: 1 on a GPU, 0.2 on a CPU)."),
    servers: Optional[str] = typer.Option(None, "--servers", rich_help_panel=TRAFFIC,
                                          help="locals,mlx_lm.server,llama.cpp (default: every one that runs here)."),
    seed: int = typer.Option(0, "--seed", rich_help_panel=TRAFFIC, help="Seed of the traffic (round r uses seed + r)."),
    max_minutes: Optional[float] = typer.Option(None, "--max-minutes", rich_help_panel=TRAFFIC,
                                                help="Start no server round that would likely end after this."),
    peer_args: Optional[list[str]] = typer.Option(
        None, "--peer-args", metavar="SERVER=ARGS", rich_help_panel=TRAFFIC,
        help="Start a peer with these arguments added, e.g. 'mlx_lm.server=--prompt-concurrency 2' (repeatable)."),
    engine: bool = typer.Option(False, "--engine", rich_help_panel=ENGINE,
                                help="Time decode in this process instead (a diagnostic: no HTTP, fixed lengths)."),
    batches: str = typer.Option("1,2,4,8", "--batches", "-b", rich_help_panel=ENGINE,
                                help="Batch sizes, comma-separated."),
    tokens: int = typer.Option(64, "--tokens", rich_help_panel=ENGINE,
                               help="Tokens each request decodes (EOS ignored)."),
    prompt_len: int = typer.Option(128, "--prompt-len", rich_help_panel=ENGINE, help="Prompt tokens per request."),
) -> None:
    """How fast this machine serves coding agents, against mlx_lm.server and llama.cpp's server.

    Fresh servers on the same weights, agent-shaped traffic over HTTP, rounds interleaved; a JSON report keeps every request."""
    _refuse_mixed_modes(ctx, engine)
    if engine:
        from locals.cli.bench_engine import engine_bench, parse_batches

        batch_list = parse_batches(batches)
        if tokens < 2 or prompt_len < 1:
            raise LocalsError("--tokens must be at least 2 and --prompt-len at least 1")
        path = _report_path(out)  # a bad --out fails now, not after the measuring
        engine_bench(model, batch_list, tokens, prompt_len, rounds, path, _check_quiet(force))
        return
    from locals.cli.bench_traffic import parse_peer_args, parse_servers, traffic_bench

    plan_args = _traffic_plan(agents, rounds, turns, time_scale, size_scale, seed, max_minutes)
    wanted = parse_servers(servers)
    peers = parse_peer_args(peer_args, wanted)
    path = _report_path(out)
    traffic_bench(model, plan_args, wanted, path, _check_quiet(force), peer_args=peers)


def _refuse_mixed_modes(ctx: typer.Context, engine: bool) -> None:
    """Options of the mode not run are refused, never silently ignored."""
    traffic = given(ctx, "agents", "turns", "time_scale", "size_scale", "servers", "seed", "max_minutes", "peer_args")
    in_process = given(ctx, "batches", "tokens", "prompt_len")
    if engine and traffic:
        raise LocalsError(f"{traffic[0]} shapes the served traffic, which --engine does not run: drop one of them")
    if not engine and in_process:
        raise LocalsError(f"{in_process[0]} is for --engine (decode timed in this process): add --engine or drop it")


def register(app: typer.Typer) -> None:
    app.command()(bench)
