"""Which GPU kernels an engine decode step runs, and each one's device time (CUDA only).

For each batch size B, on a random Qwen3-shaped 4-bit model: the engine's decode tokens/s
(so its step time) measured plainly, then the same engine run again under NVIDIA Nsight
Compute (`ncu`), which records only `--steps` decode steps (the profiler is started and
stopped from the engine thread). Kernels are grouped by name: count and microseconds per
step. If the kernels' summed time is near the step time, the device's work sets the pace
and the top families are what to cut; if far under, the gaps between kernels (launches,
the host) do. ncu runs each kernel alone, clocks unlocked, caches left as they are.
`--bytes` also records each kernel's DRAM reads and writes (which copies move how much,
and the bandwidth each family reaches).
    python benchmarks/step_kernels.py --random-model qwen3-4b --batches 1,8 --steps 4 [--bytes]
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import io
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import load_pair, no_eos, prompts, write_results  # noqa: E402
from locals.engine.bench import run_locals  # noqa: E402

SKIP_STEPS = 12  # decode steps let pass before the profiled window (prefill, first joins)
TIME = "gpu__time_duration.sum"
READ, WRITE = "dram__bytes_read.sum", "dram__bytes_write.sum"
NCU_ARGS = ["--profile-from-start", "off", "--clock-control", "none", "--cache-control", "none",
            "--csv", "--page", "raw", "--print-units", "base"]


def engine_for(random_model: str):
    from locals.engine.engine import Engine
    from locals.engine.settings import EngineConfig

    ours, _theirs, label = load_pair(random_model)
    ours = no_eos(ours)
    return Engine(ours, EngineConfig(prefix_cache_bytes=0, max_batch=256, speculate=False)), label


def mark_window(runner, steps: int) -> None:
    """Start the CUDA profiler at the engine's (SKIP_STEPS+1)-th launch and stop it once
    `steps` steps are launched."""
    driver = ctypes.CDLL("libcuda.so.1")
    launch, process = runner.launch, runner.process
    count = {"launch": 0, "process": 0}

    def marked_launch(*args, **kwargs):
        count["launch"] += 1
        if count["launch"] == SKIP_STEPS + 1:
            driver.cuProfilerStart()
            count["process"] = 0
        return launch(*args, **kwargs)

    def marked_process(*args, **kwargs):
        out = process(*args, **kwargs)
        count["process"] += 1
        # Launch n+1 comes before process n: at the `steps`-th read, launches
        # SKIP_STEPS+1 .. SKIP_STEPS+steps are all queued, and no later one.
        if count["launch"] > SKIP_STEPS and count["process"] == steps:
            driver.cuProfilerStop()
        return out

    runner.launch, runner.process = marked_launch, marked_process


def child(args) -> None:
    """Under ncu: warm up, then run a batch with the profiled window inside it."""
    engine, _label = engine_for(args.random_model)
    engine.start()
    try:
        ps = prompts(engine.loaded.tokenizer, args.batch, args.prompt_len, seed=args.batch)
        run_locals(engine, ps, 8)
        mark_window(engine.runner, args.steps)
        run_locals(engine, ps, SKIP_STEPS + args.steps + 8)
    finally:
        engine.stop()


def family(name: str) -> str:
    """A kernel's name without template arguments, parameters and namespaces."""
    name = re.sub(r"^void ", "", name)
    depth, out = 0, []
    for ch in name:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out).split("::")[-1].strip() or name[:60]


def _number(text: str | None) -> float | None:
    text = (text or "").replace(",", "")
    return float(text) if text.replace(".", "", 1).isdigit() else None


def summarize(csv_text: str, steps: int) -> dict:
    """Per kernel family: launches and microseconds per step, largest first; with DRAM
    columns (`--bytes`) also MB read and written per step and the GB/s they come to."""
    lines = [ln for ln in csv_text.splitlines() if ln.startswith('"')]
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    totals, counts = defaultdict(float), defaultdict(int)
    moved = {READ: defaultdict(float), WRITE: defaultdict(float)}
    for row in rows:
        us = _number(row.get(TIME))
        if us is None:
            continue  # the units row
        name = family(row["Kernel Name"])
        totals[name] += us / 1e3  # ns -> us
        counts[name] += 1
        for metric, per_family in moved.items():
            per_family[name] += _number(row.get(metric)) or 0.0
    families = sorted(totals, key=totals.get, reverse=True)
    out = []
    for f in families:
        entry = {"name": f, "per_step": round(counts[f] / steps, 1), "us_per_step": round(totals[f] / steps, 1)}
        if rows and READ in rows[0]:
            read, write = moved[READ][f] / steps / 1e6, moved[WRITE][f] / steps / 1e6
            entry.update(read_mb_per_step=round(read, 2), write_mb_per_step=round(write, 2),
                         gb_per_s=round((read + write) / max(totals[f] / steps, 1e-9) * 1e3, 1))  # MB/us
        out.append(entry)
    return {"kernels_per_step": round(sum(counts.values()) / steps, 1),
            "device_us_per_step": round(sum(totals.values()) / steps, 1), "families": out}


def profile(args, batch: int) -> dict:
    """Run this script's child under ncu at `batch` and summarize its kernels."""
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "kernels.csv")
        metrics = ",".join([TIME, READ, WRITE] if args.bytes else [TIME])
        cmd = [args.ncu, *NCU_ARGS, "--metrics", metrics, "--log-file", log, sys.executable, __file__, "--child",
               "--random-model", args.random_model, "--batch", str(batch), "--steps", str(args.steps),
               "--prompt-len", str(args.prompt_len)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        if done.returncode != 0 or not os.path.exists(log):
            tail = (done.stdout + done.stderr)[-2000:]
            raise SystemExit(f"ncu failed ({done.returncode}):\n{tail}")
        return summarize(Path(log).read_text(), args.steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--random-model", default="qwen3-4b")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--steps", type=int, default=4, help="decode steps in the profiled window")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--ncu", default="ncu", help="path to Nsight Compute's command line")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per profiled run")
    ap.add_argument("--bytes", action="store_true", help="also record each kernel's DRAM bytes read and written")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=8, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)

    engine, label = engine_for(args.random_model)
    engine.start()
    rows, path = [], None
    try:
        for batch in [int(b) for b in args.batches.split(",")]:
            ps = prompts(engine.loaded.tokenizer, batch, args.prompt_len, seed=batch)
            run_locals(engine, ps, 8)
            tps = run_locals(engine, ps, 32)["decode_tps"]
            rows.append({"batch": batch, "decode_tps": round(tps, 1), "step_ms": round(batch / tps * 1e3, 3)})
            print(f"B={batch}: {tps:.0f} tok/s, step {rows[-1]['step_ms']} ms", flush=True)
    finally:
        engine.stop()
    for row in rows:
        row.update(profile(args, row["batch"]))
        top = ", ".join(f"{f['name']} {f['us_per_step']:.0f} us x{f['per_step']:.0f}" for f in row["families"][:8])
        print(f"B={row['batch']}: {row['kernels_per_step']} kernels, {row['device_us_per_step'] / 1e3:.2f} ms "
              f"on the device per step (step {row['step_ms']} ms): {top}", flush=True)
        path = write_results("step_kernels", {"model": label, "steps": args.steps, "rows": rows}, path)
    print(f"results: {path}")


if __name__ == "__main__":
    main()
