"""`locals bench`: a strict decode benchmark of this machine — locals' engine against mlx-lm's
BatchGenerator on the same weights, interleaved rounds, every sample kept in a JSON report.

The measuring lives in locals.engine.bench; this module checks the machine is quiet, runs
the rounds with a progress bar and prints the table.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from locals.cli.common import console, console_err, load_with_spinner, prepare_model_process
from locals.config import state_dir
from locals.errors import LocalsError


def _parse_batches(text: str) -> list[int]:
    try:
        batches = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        batches = []
    if not batches or min(batches) < 1 or max(batches) > 256:
        raise LocalsError(f"--batches {text!r}: give batch sizes between 1 and 256, e.g. 1,2,4,8")
    return batches


def _check_quiet(force: bool) -> float:
    from locals.engine.bench import BUSY_CPU_PERCENT, other_cpu_percent

    busy = other_cpu_percent()
    if busy > BUSY_CPU_PERCENT:
        message = (f"other processes use {busy:.0f}% of the CPU: timings would measure them too. "
                   "Close them (or stop a running `locals serve`), or pass --force to measure anyway")
        if not force:
            raise LocalsError(message)
        console_err.print(f"[bold yellow]warning:[/bold yellow] {message}; the report records it.")
    return busy


def _report_path(out: Path | None) -> Path:
    """Where the JSON report goes: `out`, a new file inside `out` when it is a folder, or the state folder."""
    name = f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path = (out / name if out.is_dir() else out) if out else state_dir() / "bench" / name
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LocalsError(f"--out {out}: cannot create its folder ({exc.strerror}); pick a writable path") from None
    return path


def _table(rows: list[dict]) -> Table:
    out = Table(title="decode tok/s (median, range) · TTFT")
    for col in ("B", "locals", "mlx-lm", "locals / mlx-lm", "TTFT locals", "TTFT mlx-lm"):
        out.add_column(col, justify="right")
    for row in rows:
        ours, theirs = row["locals"], row["mlx-lm"]

        def rate(d):
            s = d["decode_tps"]
            return f"{s['median']:.1f} ({s['min']:.1f}–{s['max']:.1f})"

        ratio = ours["decode_tps"]["median"] / max(theirs["decode_tps"]["median"], 1e-9)
        out.add_row(str(row["batch"]), rate(ours), rate(theirs), f"{ratio:.2f}×",
                    f"{ours['ttft_s']['median']:.2f} s", f"{theirs['ttft_s']['median']:.2f} s")
    return out


def _measure(loaded, batches: list[int], tokens: int, prompt_len: int, rounds: int) -> list[dict]:
    from locals.engine.bench import bench_prompts, interleaved, run_locals, run_mlx_lm, summary, without_eos
    from locals.engine.engine import Engine
    from locals.engine.settings import EngineConfig

    loaded = without_eos(loaded)
    # No prefix cache: every round reads its prompts again, as mlx-lm does.
    engine = Engine(loaded, EngineConfig(prefix_cache_bytes=0, max_batch=max(batches)))
    engine.start()
    rows = []
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    try:
        with Progress(*columns, console=console_err, transient=True) as progress:
            task = progress.add_task("benchmarking", total=len(batches) * (rounds + 1) * 2)
            for batch in batches:
                prompts = bench_prompts(loaded.tokenizer, batch, prompt_len, seed=batch)
                runners = {"locals": lambda: run_locals(engine, prompts, tokens),
                           "mlx-lm": lambda: run_mlx_lm(loaded.model, prompts, tokens)}
                progress.update(task, description=f"B={batch}")
                runners = {n: (lambda fn=fn: (fn(), progress.advance(task))[0]) for n, fn in runners.items()}
                samples = interleaved(rounds, runners)
                row = {"batch": batch}
                for name, runs in samples.items():
                    row[name] = {"decode_tps": summary([r["decode_tps"] for r in runs]),
                                 "ttft_s": summary([r["ttft_s"] for r in runs]), "samples": runs}
                rows.append(row)
    finally:
        engine.stop()
    return rows


def bench(
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model to measure (default: this machine's)."),
    batches: str = typer.Option("1,2,4,8", "--batches", "-b", help="Batch sizes, comma-separated."),
    tokens: int = typer.Option(64, "--tokens", help="Tokens each request decodes (EOS ignored)."),
    prompt_len: int = typer.Option(128, "--prompt-len", help="Prompt tokens per request."),
    rounds: int = typer.Option(3, "--rounds", "-r", help="Timed rounds per variant (after one warm-up)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Where to write the JSON report."),
    force: bool = typer.Option(False, "--force", help="Measure even when other processes keep the CPU busy."),
) -> None:
    """Measure decode speed of locals against mlx-lm on this machine, same weights, and save a JSON report."""
    batch_list = _parse_batches(batches)
    if tokens < 2 or prompt_len < 1 or rounds < 1:
        raise LocalsError("--tokens must be at least 2, --prompt-len and --rounds at least 1")
    path = _report_path(out)  # a bad --out fails now, not after the measuring
    busy_before = _check_quiet(force)  # before loading: a download or load would be wasted on a busy machine
    prepare_model_process()
    loaded = load_with_spinner(model)
    from locals.engine.bench import machine_info, other_cpu_percent

    rows = _measure(loaded, batch_list, tokens, prompt_len, rounds)
    report = {"benchmark": "locals bench", "when": time.strftime("%Y-%m-%d %H:%M:%S"), "model": loaded.name,
              "model_id": loaded.model_id, "backend": loaded.backend.kind, "tokens": tokens,
              "prompt_len": prompt_len, "rounds": rounds, "other_cpu_percent_before": busy_before,
              "other_cpu_percent_after": other_cpu_percent(0.5), "machine": machine_info(), "rows": rows}
    path.write_text(json.dumps(report, indent=1))
    console.print(_table(rows))
    console.print(f"same weights for both ({loaded.backend.kind}); report: {path}")


def register(app: typer.Typer) -> None:
    app.command()(bench)
