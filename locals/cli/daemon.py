"""`locals start`, `serve`, `stop` and `status`: the server in the background or foreground."""

from __future__ import annotations

import logging
import time
from typing import Optional

import typer
from rich.table import Table

from locals import settings
from locals import daemon
from locals.cli.common import console, console_err, prepare_model_process
from locals.config import DEFAULT_HOST, DEFAULT_PORT, load_remembered
from locals.errors import LocalsError

MODEL_HELP = "Alias (qwen, lfm, smollm2…), Hugging Face repo id or local folder."


def start(
    model: Optional[str] = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    port: Optional[int] = typer.Option(None, "--port", "-p", min=1, max=65535,
                                       help=f"Port (default: the last one, else {DEFAULT_PORT})."),
    timeout: float = typer.Option(daemon.START_TIMEOUT_S, "--timeout", min=1, help="Seconds to wait for the model."),
    overflow: Optional[str] = typer.Option(
        None, "--overflow", envvar=settings.OVERFLOW.name,
        help="A conversation longer than the model's context: `refuse` it (a 400, the default) "
             "or `trim` it (the oldest tool results dropped, with a marker); see `locals serve`."),
) -> None:
    """Start the server in the background and wait until the model is loaded (its log: `locals status --logs`)."""
    if overflow is not None:
        _check_overflow(overflow)
    phase = {"text": "starting the server…"}

    def on_wait(body: dict | None) -> None:
        state = (body or {}).get("status")
        phase["text"] = (f"loading {body.get('model')}…" if state == "loading" else
                         "another `locals start` is starting the server; waiting for it…"
                         if state == "starting elsewhere" else
                         "the running server is busy and does not answer; waiting for it…"
                         if state == "busy" else "starting the server…")
        spinner.update(phase["text"])

    t0 = time.monotonic()
    try:
        with console_err.status(phase["text"], spinner="dots") as spinner:
            url = daemon.start(model, port, timeout=timeout, on_wait=on_wait, overflow=overflow)
    except daemon.AlreadyRunning as exc:
        from locals.engine.load.catalog import split_thinking, strip_editor_prefix

        if model and not daemon.same_model(split_thinking(strip_editor_prefix(model))[0], exc.model or ""):
            raise  # a script asked for another model: it must not go on as if it had it
        console.print(str(exc))
        return
    body = daemon.health(port) or {}
    console.print(f"locals is serving [bold]{body.get('model', model)}[/bold] at {url} "
                  f"(ready in {time.monotonic() - t0:.1f} s)")
    console.print(f"[dim]OpenAI: {url}/v1 · Anthropic: {url} · Ollama: {url} · dashboard: {url}/[/dim]")


def serve(
    model: Optional[str] = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    host: str = typer.Option(DEFAULT_HOST, "--host", help="Address to bind; non-loopback needs --allow-remote."),
    port: int = typer.Option(DEFAULT_PORT, "--port", "-p", min=1, max=65535, help="Port to listen on."),
    allow_remote: bool = typer.Option(False, "--allow-remote", help="Accept requests from other machines."),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar=settings.API_KEY.name,
                                          help="Require this key (Bearer or x-api-key)."),
    max_body_mb: int = typer.Option(32, "--max-body-mb", min=1, help="Largest request body accepted, in MB."),
    max_tokens: Optional[int] = typer.Option(
        None, "--max-tokens", envvar=settings.MAX_TOKENS.name, min=1,
        help="Longest reply any request gets, whatever it asks; also what a request naming no limit gets "
             "(4096 without it; Codex sends none)."),
    overflow: str = typer.Option(
        settings.OVERFLOW.default, "--overflow", envvar=settings.OVERFLOW.name,
        help="A conversation longer than the model's context: `refuse` it (a 400) or `trim` it (the oldest "
             "tool results dropped, with a marker; a request's `truncation` field overrides)."),
    log_level: str = typer.Option("INFO", "--log-level", help="DEBUG, INFO, WARNING or ERROR."),
) -> None:
    """Run the server in the foreground (takes mlx_lm.server's --model/--host/--port)."""
    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        raise LocalsError(f"--log-level {log_level!r}: use DEBUG, INFO, WARNING or ERROR")
    _check_overflow(overflow)
    running = daemon.health(port, host, timeout=0.5)
    if running is not None:  # said before loading a model only to find the port taken
        raise LocalsError(f"locals already runs on port {port} with {running.get('model')}; "
                          f"`locals status --port {port}` shows it, or pick another --port")
    prepare_model_process()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from locals.server.run import serve as run_server

    try:
        run_server(model, host, port, api_key=api_key, allow_remote=allow_remote, max_body_mb=max_body_mb,
                   max_tokens=max_tokens, overflow=overflow, on_bound=lambda _: daemon.mark_serving(port, host, model))
    finally:
        daemon.unmark_serving(port)


def stop(port: Optional[int] = typer.Option(None, "--port", "-p", min=1, max=65535,
                                           help=f"Port (default: the last one, else {DEFAULT_PORT}).")) -> None:
    """Stop the background server."""
    port = port or load_remembered().port
    with console.status(f"stopping locals on port {port} (replies in flight finish first; at most "
                        f"{daemon.STOP_TIMEOUT_S} s)"):
        stopped = daemon.stop(port)
    if stopped:
        console.print(f"stopped locals on port {port}")
    else:
        console.print(f"locals is not running on port {port}")
    for other in daemon.other_servers(port):
        console.print(f"locals still runs on port {other}: `locals stop --port {other}` stops it")


def _size(n: float) -> str:
    return f"{n / (1 << 30):.2f} GB" if n >= 1 << 30 else f"{n / (1 << 20):.0f} MB"


def _uptime(s: float) -> str:
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min" if s < 5400 else f"{s / 3600:.1f} h"


def status(
    port: Optional[int] = typer.Option(None, "--port", "-p", min=1, max=65535,
                                       help=f"Port (default: the last one, else {DEFAULT_PORT})."),
    logs: bool = typer.Option(False, "--logs", help="Print the end of the server log instead."),
    lines: Optional[int] = typer.Option(None, "--lines", "-n", min=1,
                                        help="Log lines to print with --logs (default 40)."),
) -> None:
    """Show what the server is doing: model, memory, uptime, requests, speed, cache hits."""
    port = port or load_remembered().port
    if lines is not None and not logs:
        raise LocalsError(f"--lines goes with --logs: `locals status --logs -n {lines}`")
    lines = lines or 40
    if logs:
        path = daemon.log_path(port)
        if not path.exists():
            raise LocalsError(f"no log at {path}: the server on port {port} was never started with `locals start`")
        console.print(f"[dim]{path}[/dim]")
        typer.echo(daemon.log_tail(port, lines))
        return
    snap = daemon.status(port)
    if snap is None:
        raise _no_status(port)
    table = Table(show_header=False, box=None)
    table.add_row("model", f"{snap['model']} ({snap['status']})")
    table.add_row("address", daemon.base_url(port))
    table.add_row("uptime", _uptime(snap["uptime_s"]))
    table.add_row("memory", _size(snap["memory_rss_bytes"]))
    engine, reqs = snap.get("engine"), snap.get("requests")
    if engine and reqs:
        table.add_row("requests", f"{reqs['total']} total, {reqs['in_flight']} in flight "
                                  f"({engine['running']} decoding, {engine['prefilling']} reading a prompt, "
                                  f"{engine['waiting']} queued)")
        table.add_row("speed", f"{engine['decode_tokens_per_s']:.1f} tok/s decode, "
                               f"{engine['prefill_tokens_per_s']:.0f} tok/s prompt")
        table.add_row("cache hits", f"{engine['cached_tokens_total']} of {engine['prompt_tokens_total']} "
                                    "prompt tokens served from the prefix cache")
        table.add_row("KV cache", _size(engine["kv_bytes"]) +
                      (f" of {_size(engine['kv_budget_bytes'])}" if engine["kv_budget_bytes"] else ""))
        extra = engine.get("extra") or {}
        for label, line in (("disk cache", disk_line(extra)), ("kernels", kernels_line(extra)),
                            ("compiles", compiles_line(extra)), ("stalls", gaps_line(extra))):
            if line:  # each says nothing where it has nothing to say (a CPU, no disk tier)
                table.add_row(label, line)
    console.print(table)


def _no_status(port: int) -> LocalsError:
    """Why no locals server answered on `port`, and what to do about it."""
    stuck = daemon.unanswering_server(port)
    if stuck:
        return LocalsError(f"locals on port {port} (pid {stuck}) does not answer (still starting, stuck or paused); "
                           f"`locals stop --port {port}` ends it")
    if daemon.port_answers(port):
        return LocalsError(f"port {port} is held by another program, not locals; start locals on another port "
                           "(`locals start --port N`) or stop that program")
    others = daemon.other_servers(port)
    if others:
        return LocalsError(f"locals is not running on port {port}; it runs on port "
                           f"{', '.join(map(str, others))} (`locals status --port {others[0]}`)")
    flag = f" --port {port}" if port != DEFAULT_PORT else ""
    return LocalsError(f"locals is not running on port {port}; run `locals start{flag}`")


def disk_line(extra: dict) -> str | None:
    """The prompt cache's disk writes, with the latest failure's reason; None without a disk tier."""
    writes = extra.get("prefix_disk_writes") or {}
    if not writes:
        return None
    written = int(writes.get("written") or 0)
    line = f"{written} prompt{'' if written == 1 else 's'} written, {int(extra.get('prefix_disk_hits') or 0)} loaded"
    if writes.get("failed"):
        line += f"; [red]{writes['failed']} not written[/red] (latest: {writes.get('last_failure')})"
    return line


def kernels_line(extra: dict) -> str | None:
    """What the tuned and fused kernels are doing, or None where there is nothing to say (CPU)."""
    tuned, left = int(extra.get("tuned_layers") or 0), int(extra.get("untuned_pairs") or 0)
    fused = {k: int(v) for k, v in (extra.get("fused_kernel_layers") or {}).items() if v}
    if not tuned and not left and not fused:
        return None
    line = f"{tuned} layers use tuned kernels"
    if left:
        line += f"; {left} layer shape x row count pairs untuned (run `locals tune`)"
    names = {"heads": "q/k norm + RoPE", "norms": "add + norm", "attention": "decode attention"}
    if fused:
        line += "; fused " + ", ".join(f"{names.get(k, k)} in {n} layers" for k, n in fused.items())
    folded = extra.get("folded_in_matmuls") or {}
    inside = [f"{what} inside {int(folded.get(key) or 0)} matmuls"
              for key, what in (("norms", "add + norm"), ("activations", "SwiGLU")) if folded.get(key)]
    return "; ".join([line, *inside])


def compiles_line(extra: dict) -> str | None:
    """Shapes compiled ahead, passes run uncompiled meanwhile, and steps that held their streams
    2 s or more (a wait on a compile shows there), or None for an engine that compiles nothing ahead."""
    shapes = int(extra.get("compiled_shapes") or 0)
    if not shapes:
        return None
    ahead = "compiling more while idle" if extra.get("compiling_ahead") else "all compiled"
    line = (f"{shapes} shapes ahead in {float(extra.get('compile_seconds') or 0):.0f} s ({ahead}); "
            f"{int(extra.get('uncompiled_passes') or 0)} passes ran uncompiled")
    slow = int(extra.get("slow_steps") or 0)
    if slow:
        line += f"; {slow} steps of 2 s or more (longest {float(extra.get('slowest_step_s') or 0):.1f} s)"
    return line


def gaps_line(extra: dict) -> str | None:
    """Stalls between two steps (gaps of 100 ms or more and twice the typical one, engine/stats.py:
    every decoding stream waited that long) and where the engine spent most of them, or None."""
    gaps = extra.get("long_gaps") or {}
    count, phases = int(gaps.get("count") or 0), gaps.get("ms_by_phase") or {}
    if not count:
        return None
    top = ", ".join(f"{phase} {ms / 1e3:.1f} s" for phase, ms in list(phases.items())[:2])
    return f"{count} between steps ({top})"


def register(app: typer.Typer) -> None:
    app.command()(start)
    app.command()(serve)
    app.command()(stop)
    app.command()(status)


def _check_overflow(policy: str) -> None:
    from locals.server.overflow import POLICIES

    if policy not in POLICIES:
        raise LocalsError(f"--overflow (or {settings.OVERFLOW.name}) {policy!r}: use {' or '.join(POLICIES)}")
