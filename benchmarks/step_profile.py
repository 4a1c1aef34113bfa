"""Where a decode step's time goes in locals' engine: Python building the step's graph
(launch = forward + sample graph building + async_eval queuing it), waiting for the device
(wait), Python reading the tokens back (process), the loop's other parts (loop: drain, admit,
scheduling, reaping) and garbage collection, per batch size; as shipped, and with parts turned
off (an engine a variant, on the same weights).

With pipelining, the device runs step n while Python builds step n+1. A large `wait`
means the step is device-bound, but a small one does not prove it host-bound: MLX blocks
inside `async_eval` once more than 10 command buffers are in flight (on CUDA a buffer is
a graph of 20 kernels), so device time can show up in `launch`. A native profile (py-spy
--native) of the engine thread tells them apart: busy means host-bound.
    python benchmarks/step_profile.py --random-model qwen3-4b --batches 1,4,8,16,32
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import bench_engine, load_pair, no_eos, prompts, ragged, write_results  # noqa: E402
from locals.engine.bench import run_locals  # noqa: E402

# name -> how its engine differs from locals as shipped (bench_engine's arguments)
VARIANTS = {
    "locals": {},
    "seams": {"whole_steps": False},  # compiled seams around eager attention, not one graph a step
    "scatter": {"cache_writes": False},  # whole steps store K/V with a scatter, not from the q/k kernel
    "no-compile": {"compile_max_tokens": 0},  # no compiled graphs
    "mlx-ops": {"untuned": True},  # MLX's own ops (run only where this chip is tuned)
}


class StepClock:
    """The step runner's profiling hook (`StepRunner.profile`): each phase of every step, the
    time between steps read back, and the time Python's garbage collector ran."""

    STEP_PARTS = ("launch", "wait", "process")  # the rest of a step is the engine loop's own work

    def __init__(self):
        self.samples: dict[str, list[float]] = {}
        self.marks: list[float] = []
        self._timed = 0.0  # seconds of STEP_PARTS since the last step was read
        self.gc_s, self._gc_start = 0.0, 0.0
        gc.callbacks.append(self._on_gc)

    def record(self, phase: str, seconds: float) -> None:
        self.samples.setdefault(phase, []).append(seconds)
        if phase in self.STEP_PARTS:
            self._timed += seconds
        if phase == "process":
            now = time.perf_counter()
            if self.marks:
                self.samples.setdefault("loop", []).append(now - self.marks[-1] - self._timed)
            self.marks.append(now)
            self._timed = 0.0

    def _on_gc(self, phase: str, _info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.gc_s += time.perf_counter() - self._gc_start

    def reset(self) -> None:
        self.samples.clear()
        self.marks.clear()
        self._timed = self.gc_s = 0.0

    def report(self) -> dict:
        """Median milliseconds per phase, and per step (between consecutive reads); `loop`, the
        rest of each step: the engine loop's own parts (drain, admit, schedule, reap)."""
        gaps = [b - a for a, b in zip(self.marks, self.marks[1:])]
        out = {k: round(statistics.median(v) * 1e3, 3) for k, v in self.samples.items() if v}
        out["step"] = round(statistics.median(gaps) * 1e3, 3) if gaps else None
        out["steps"] = len(self.marks)
        out["gc_ms_per_step"] = round(self.gc_s * 1e3 / max(len(self.marks), 1), 3)
        # Every step's time, in order: a median can hide two kinds of step.
        out["step_samples"] = [round(g * 1e3, 2) for g in gaps]
        # Inside launch too: on the H200 every third or fourth B = 4-8 step is
        # ~15 ms longer, inside `async_eval` (MLX waits there for the device to catch up).
        for part in ("launch", "forward", "async_eval", "wait"):
            if self.samples.get(part):
                out[f"{part}_samples"] = [round(v * 1e3, 2) for v in self.samples[part]]
        return out


def brief(report: dict) -> dict:
    """A report without its per-step samples, for printing."""
    return {k: v for k, v in report.items() if not k.endswith("_samples")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--random-model", default=None, help="qwen3-4b on a GPU; qwen3-tiny tries it on a CPU")
    ap.add_argument("--batches", default="1,4,8,16,32")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--length-spread", type=int, default=0,
                    help="prompt lengths spread evenly over prompt-len .. prompt-len + this (rows at "
                         "different lengths; 0: all equal)")
    ap.add_argument("--variants", default="locals,seams,no-compile,mlx-ops",
                    help=f"which of {', '.join(VARIANTS)} to run")
    args = ap.parse_args()

    ours, _theirs, label = load_pair(args.random_model)
    ours = no_eos(ours)
    clock = StepClock()
    engines = {}
    # Engines that patch the model first: an untuned one runs on the patched model's twin.
    for name in sorted(args.variants.split(","), key=lambda n: "untuned" in VARIANTS[n]):
        if "untuned" in VARIANTS[name] and not any(e.patched_layers for e in engines.values()):
            print(f"{name}: skipped, no tuned kernels here", flush=True)
            continue
        engines[name] = bench_engine(ours, **VARIANTS[name], profile=clock.record)
    tuned_layers = max(e.patched_layers for e in engines.values())
    rows, path = [], None
    try:
        for batch in [int(b) for b in args.batches.split(",")]:
            ps = ragged(prompts(ours.tokenizer, batch, args.prompt_len + args.length_spread, seed=batch),
                        args.prompt_len, args.length_spread)
            row = {"batch": batch}
            for name, variant in engines.items():
                run_locals(variant, ps, 8)  # warm-up: shapes compiled
                clock.reset()
                result = run_locals(variant, ps, args.tokens)
                row[name] = {**clock.report(), "decode_tps": round(result["decode_tps"], 1)}
            rows.append(row)
            print(f"B={batch:3d} " + "  ".join(f"{k}: {brief(v)}" for k, v in row.items() if k != "batch"),
                  flush=True)
            # After each batch size: a run cut short keeps what it measured.
            path = write_results("step_profile", {"model": label, "tokens": args.tokens, "rows": rows,
                                                  "prompt_len": args.prompt_len, "length_spread": args.length_spread,
                                                  "tuned_layers": tuned_layers}, path)
    finally:
        for variant in engines.values():
            variant.stop()
    print(f"results: {path}")


if __name__ == "__main__":
    main()
