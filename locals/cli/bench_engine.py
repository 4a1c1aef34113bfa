"""`locals bench --engine`: the in-process decode diagnostic — locals' engine against mlx-lm's
BatchGenerator in this process, same weights, fixed prompt and reply lengths, no HTTP. It shows
what the engine can do; what a client gets is what the served-traffic benchmark measures.

The measuring lives in locals.engine.bench; this module runs its rounds with a progress bar
and prints the table.
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.table import Table

from locals.cli.common import console, load_with_spinner, prepare_model_process, progress_bar
from locals.errors import LocalsError


def parse_batches(text: str) -> list[int]:
    try:
        batches = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        batches = []
    if not batches or min(batches) < 1 or max(batches) > 256:
        raise LocalsError(f"--batches {text!r}: give batch sizes between 1 and 256, e.g. 1,2,4,8")
    return batches


def _table(rows: list[dict]) -> Table:
    out = Table(title="in-process decode tok/s (median, range) · TTFT — a diagnostic, not served speed")
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
    from locals.engine.bench import bench_prompts, run_locals, run_mlx_lm, without_eos
    from locals.measure import interleaved, summary
    from locals.engine.engine import Engine
    from locals.engine.settings import EngineConfig

    loaded = without_eos(loaded)
    # No prefix cache: every round reads its prompts again, as mlx-lm does. No prompt-lookup
    # drafts: they accept whole runs of the prompts' repeated filler, which real replies do not
    # repeat (on two CPU cores B = 1 read 61 tok/s with them, 15 as served).
    engine = Engine(loaded, EngineConfig(prefix_cache_bytes=0, max_batch=max(batches), speculate=False))
    engine.start()
    rows = []
    try:
        with progress_bar() as progress:
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


def engine_bench(model: str | None, batches: list[int], tokens: int, prompt_len: int, rounds: int,
                 path: Path, busy_before: float) -> None:
    """Measure, write the JSON report to `path`, print the table."""
    import json

    from locals.engine.bench import machine_info
    from locals.measure import other_cpu_percent

    prepare_model_process()
    loaded = load_with_spinner(model)
    rows = _measure(loaded, batches, tokens, prompt_len, rounds)
    report = {"benchmark": "locals bench --engine", "when": time.strftime("%Y-%m-%d %H:%M:%S"),
              "model": loaded.name, "model_id": loaded.model_id, "backend": loaded.backend.kind, "tokens": tokens,
              "prompt_len": prompt_len, "rounds": rounds, "other_cpu_percent_before": busy_before,
              "other_cpu_percent_after": other_cpu_percent(0.5), "machine": machine_info(), "rows": rows}
    path.write_text(json.dumps(report, indent=1))
    console.print(_table(rows))
    console.print(f"same weights for both ({loaded.backend.kind}), in this process; report: {path}")
