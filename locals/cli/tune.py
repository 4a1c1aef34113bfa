"""`locals tune`: verify and time the small-batch kernels on this chip, and show what was chosen.

The work happens in locals.engine.kernels.tuning.tuner; this module parses options, picks the
problems (a model's quantized layers or explicit shapes) and prints the table.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import Optional

import typer
from rich.table import Table

from locals.cli.common import console, console_err, given, load_with_spinner, prepare_model_process, progress_bar
from locals.errors import LocalsError


def _parse_rows(text: str) -> list[int]:
    """Row counts from "4", "1-16" or a comma-separated mix ("8,16,2-4"), in the order given."""
    from locals.engine.kernels.qmm import WIDE_MAX_ROWS

    rows: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            span = list(range(int(lo), int(hi if sep else lo) + 1))
        except ValueError:
            span = []
        if not span or span[0] < 1 or span[-1] > WIDE_MAX_ROWS:
            raise LocalsError(f"--rows {text!r}: give counts or ranges within 1-{WIDE_MAX_ROWS}, "
                              "e.g. 1-16, 4 or 8,16,2-4")
        rows += [m for m in span if m not in rows]
    return rows


def _parse_shape(text: str, bits: int, group_size: int, dtype: str):
    from locals.engine.kernels.tuning.tuner import Problem

    try:
        n, k = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise LocalsError(f"--shape {text!r}: write it as OUTxIN, e.g. 9728x2560") from None
    if n < 1 or k < group_size or k % group_size:
        raise LocalsError(f"--shape {text!r}: IN must be a positive multiple of the group size ({group_size})")
    return Problem(n, k, bits, group_size, dtype)


def _spans(choices: dict[str, str]) -> list[tuple[str, str]]:
    """Row counts grouped into runs with the same choice: [("1", "mlx"), ("2-7", "cuda-…")]."""
    runs: list[list] = []
    for rows in sorted(choices, key=int):
        if runs and runs[-1][2] == choices[rows] and int(rows) == runs[-1][1] + 1:
            runs[-1][1] = int(rows)
        else:
            runs.append([int(rows), int(rows), choices[rows]])
    return [(f"{a}" if a == b else f"{a}-{b}", name) for a, b, name in runs]


def print_table(table) -> None:
    """The choices per problem and row span, with the median speed-up over MLX's op."""
    from locals.engine.kernels.tuning.tuner import MLX_OP

    out = Table(title=f"{table.chip} · MLX {table.mlx}" + ("" if table.complete else " · incomplete"))
    for col in ("layer shape", "rows", "kernel", f"vs MLX ({table.clock} time)"):
        out.add_column(col)
    for key, choices in sorted(table.choices.items()):
        timings = table.timings_us.get(key, {})
        for span, name in _spans(choices):
            lo, _, hi = span.partition("-")
            gains = [timings[str(m)][MLX_OP] / timings[str(m)][name]
                     for m in range(int(lo), int(hi or lo) + 1) if name in timings.get(str(m), {})]
            gain = f"x{sorted(gains)[len(gains) // 2]:.2f}" if gains and name != MLX_OP else "-"
            out.add_row(key, span, name, gain)
    console.print(out)
    for name, reason in sorted(table.rejected.items()):
        console.print(f"[yellow]rejected[/yellow] {name}: {reason}")


def tune(
    ctx: typer.Context,
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Tune this model's quantized layers."),
    shape: Optional[list[str]] = typer.Option(None, "--shape", help="Tune an OUTxIN layer shape instead (repeatable)."),
    bits: int = typer.Option(4, "--bits", help="Quantization bits for --shape (4 or 8)."),
    group_size: int = typer.Option(64, "--group-size", help="Quantization group size for --shape."),
    dtype: str = typer.Option("bfloat16", "--dtype", help="Activation dtype for --shape."),
    rows: Optional[str] = typer.Option(None, "--rows",
                                       help="Batch rows to tune, in this order: e.g. 1-16 or 8,16,2-7 "
                                            "(default: 2,4,8,16,32 on CUDA, 1-16 elsewhere)."),
    rounds: int = typer.Option(7, "--rounds", help="Interleaved timing rounds per choice (on CUDA three times "
                               "as many, each a short chain timed by the GPU's own clock)."),
    only: Optional[str] = typer.Option(None, "--only",
                                       help="Try only candidates whose names contain one of these "
                                            "(comma-separated), e.g. qmma,mlx-pad8; MLX's op is always timed."),
    fresh: bool = typer.Option(False, "--fresh", help="Forget earlier results for this chip first."),
    report: bool = typer.Option(False, "--report", help="Only show what is stored for this chip."),
) -> None:
    """Verify every candidate kernel on this chip, time it per layer shape and batch size, keep the fastest."""
    from locals.engine.kernels.tuning.tuner import current_chip, load_table, new_table, save_table
    from locals.engine.kernels.tuning.tuner import tune as run_tuning
    from locals.engine.kernels.tuning.tuner import tuning_rows
    from locals.engine.load.backend import cuda_launch_settings

    # The device timer brackets chains MLX captures in one CUDA graph (tuning/clock.py): graphs on here.
    cuda_launch_settings(graphs=True)
    _refuse_contradictions(ctx, report, shape)
    if report:
        _report()
        return
    _check_options(bits, dtype, group_size, rounds)
    row_list = _parse_rows(rows) if rows else None
    pool = _candidates_named(only) if only else None
    problems = [_parse_shape(s, bits, group_size, dtype) for s in shape] if shape else _model_problems(model)
    if not problems:
        console.print("This model has no quantized layers on this device (the CPU backend runs dense "
                      "weights), so there is nothing to tune: MLX's own ops are used.")
        return
    table = (None if fresh else load_table()) or new_table()
    rows_asked = row_list or tuning_rows(current_chip()[0])
    pairs = sum(1 for p in problems for m in rows_asked if str(m) not in table.choices.get(p.key, {}))

    with stop_requested() as stop, tuning_progress(pairs) as (progress, advance):
        def pair_done() -> None:  # saved as it goes: a tuning run killed keeps what it measured
            advance()
            save_table(table)

        run_tuning(problems, rows=row_list, candidates=pool, table=table, rounds=rounds,
                   progress=progress, pause=stop.is_set, on_pair=pair_done)
    path = save_table(table)
    print_table(table)
    console_err.print(f"[dim]saved to {path}[/dim]")
    if not table.complete:
        console_err.print("[yellow]stopped early:[/yellow] what was measured is saved; run "
                          "`locals tune` again to resume")


def _candidates_named(only: str) -> list:
    """The candidates `--only` names (comma-separated parts of their names) on this device."""
    from locals.engine.kernels.tuning.tuner import current_chip, default_candidates

    parts = [p.strip() for p in only.split(",") if p.strip()]
    pool = [c for c in default_candidates(current_chip()[0]) if any(p in c.name for p in parts)]
    if not pool:
        raise LocalsError(f"--only {only!r} matches no candidate on this device; `locals tune --report` "
                          "lists the names tuning chose before")
    return pool


def _model_problems(model: str | None) -> list:
    """The quantized layers of `model` as the engine serves them (q/k/v and gate/up joined)."""
    from locals.engine.forward.fuse import fuse_projections
    from locals.engine.kernels.tuning.tuner import model_problems

    prepare_model_process()
    loaded_model = load_with_spinner(model).model
    fuse_projections(loaded_model)  # the engine serves (and so tunes) the joined linears
    return model_problems(loaded_model)


def _report() -> None:
    """Print this chip's stored table, or say how to make one."""
    from locals.engine.kernels.tuning.tuner import current_chip, load_table, table_path

    table = load_table()
    if table is None:
        hint = ("`locals tune`" if current_chip()[0] != "cpu" else
                "`locals tune --shape OUTxIN` (the CPU backend runs dense weights, so models have nothing to tune)")
        console.print(f"nothing stored: this chip has no tuning results for this MLX version; {hint} makes them")
        return  # a report of nothing stored is an answer, not an error
    print_table(table)
    if not table_path(table.chip, table.mlx).exists():
        console_err.print("[dim]the table shipped with locals for this chip; `locals tune` times the pairs it lacks[/dim]")


def _refuse_contradictions(ctx: typer.Context, report: bool, shape: list[str] | None) -> None:
    """Options that would be ignored are refused, saying which."""
    tuning = given(ctx, "model", "shape", "bits", "group_size", "dtype", "rows", "rounds", "only", "fresh")
    if report and tuning:
        raise LocalsError(f"--report only shows what is stored, it tunes nothing: drop {tuning[0]} or --report")
    if shape and given(ctx, "model"):
        raise LocalsError("--model and --shape: tune a model's layers or the shapes given, not both")
    layer = given(ctx, "bits", "group_size", "dtype")
    if not shape and layer:
        raise LocalsError(f"{layer[0]} describes a --shape (a model's layers bring their own): add --shape OUTxIN "
                          "or drop it")


def _check_options(bits: int, dtype: str, group_size: int, rounds: int) -> None:
    """Refuse --shape options tuning cannot use, before anything loads."""
    problems = [f"--bits {bits}: use 4 or 8" if bits not in (4, 8) else "",
                f"--dtype {dtype}: use bfloat16, float16 or float32" if dtype not in ("bfloat16", "float16", "float32") else "",
                f"--group-size {group_size}: use 32, 64 or 128" if group_size not in (32, 64, 128) else "",
                f"--rounds {rounds}: use at least 1" if rounds < 1 else ""]
    if any(problems):
        raise LocalsError("; ".join(p for p in problems if p))


@contextlib.contextmanager
def tuning_progress(pairs: int):
    """(progress(msg), advance()) for tuning `pairs` (layer shape, rows) pairs: a bar with the
    latest step in a terminal; elsewhere (a log, CI) a timestamped line per step."""
    if not console_err.is_terminal:
        start = time.perf_counter()
        done = [0]

        def line(msg: str) -> None:
            console_err.print(f"[{time.perf_counter() - start:6.1f} s · {done[0]}/{pairs} pairs] {msg}",
                              highlight=False, markup=False, soft_wrap=True)

        yield line, lambda: done.__setitem__(0, done[0] + 1)
        return
    with progress_bar() as bar:
        task = bar.add_task("verifying kernels…", total=pairs)
        yield (lambda msg: bar.update(task, description=msg[:60])), (lambda: bar.advance(task))


@contextlib.contextmanager
def stop_requested():
    """An Event set by Ctrl-C or SIGTERM while tuning: tuning stops at its next pause point
    (within one kernel compile or timing round) so the partial table can be saved."""
    stop = threading.Event()
    handler = lambda _sig, _frame: stop.set()  # noqa: E731
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def register(app: typer.Typer) -> None:
    app.command()(tune)
