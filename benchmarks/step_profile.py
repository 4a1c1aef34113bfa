"""Where a decode step's time goes in locals' engine: Python building the step's graph
(launch = forward + sample graph building + async_eval queuing it), waiting for the device
(wait), Python reading the tokens back (process), the loop's other parts (drain, admit,
next_step, reap) and garbage collection, per batch size; as shipped, without compiled
layers, and without tuned kernels (if tuned).

With pipelining, the device runs step n while Python builds step n+1. A large `wait`
means the step is device-bound, but a small one does not prove it host-bound: MLX blocks
inside `async_eval` once more than 10 command buffers are in flight (on CUDA a buffer is
a graph of 20 kernels), so device time can show up in `launch`. A native profile (py-spy
--native) of the engine thread tells them apart: busy means host-bound.
    python benchmarks/step_profile.py --random-model qwen3-4b --batches 1,4,8,16,32
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlx.core as mx  # noqa: E402

from benchmarks.common import load_pair, no_eos, prompts, ragged, write_results  # noqa: E402
from locals.engine.bench import run_locals  # noqa: E402
from locals.engine.step import StepRunner  # noqa: E402


class StepClock:
    """Wraps a StepRunner's launch/process, and the engine loop's other parts, to time each
    phase of every step; also the time Python's garbage collector ran."""

    LOOP_PARTS = ("_drain", "_admit", "_reap", "_sync_for_masks", "_sync_for_drafts")

    def __init__(self, runner: StepRunner, engine=None):
        self.samples: dict[str, list[float]] = {"launch": [], "wait": [], "process": []}
        self.marks: list[float] = []
        self.gc_s, self._gc_start = 0.0, 0.0
        launch, process = runner.launch, runner.process
        if engine is not None:
            for part in self.LOOP_PARTS:
                self._wrap(engine, part)
            self._wrap(engine.scheduler, "next_step")
            # Inside launch: building the model's graph, building sampling's, and MLX
            # queuing the work (async_eval: its own graph walk and kernel dispatch).
            from locals.engine import step as step_module

            self._wrap(step_module, "forward")
            self._wrap(step_module, "sample")
            queue = ModuleProxy(step_module.mx)
            self._wrap(queue, "async_eval")
            step_module.mx = queue
        gc.callbacks.append(self._on_gc)

        def timed_launch(slots):
            t = time.perf_counter()
            out = launch(slots)
            self.samples["launch"].append(time.perf_counter() - t)
            return out

        def timed_process(step):
            t = time.perf_counter()
            if step.sampled is not None:
                mx.eval(step.sampled.tokens)
            t1 = time.perf_counter()
            out = process(step)
            t2 = time.perf_counter()
            self.samples["wait"].append(t1 - t)
            self.samples["process"].append(t2 - t1)
            self.marks.append(t2)
            return out

        runner.launch, runner.process = timed_launch, timed_process

    def _wrap(self, owner, name: str) -> None:
        fn = getattr(owner, name)
        self.samples[name.lstrip("_")] = samples = []

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                samples.append(time.perf_counter() - t)

        setattr(owner, name, timed)

    def _on_gc(self, phase: str, _info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.gc_s += time.perf_counter() - self._gc_start

    def reset(self) -> None:
        for v in self.samples.values():
            v.clear()
        self.marks.clear()
        self.gc_s = 0.0

    def report(self) -> dict:
        """Median milliseconds per phase, and per step (between consecutive reads)."""
        gaps = [b - a for a, b in zip(self.marks, self.marks[1:])]
        out = {k: round(statistics.median(v) * 1e3, 3) for k, v in self.samples.items() if v}
        out["step"] = round(statistics.median(gaps) * 1e3, 3) if gaps else None
        out["steps"] = len(self.marks)
        out["gc_ms_per_step"] = round(self.gc_s * 1e3 / max(len(self.marks), 1), 3)
        # Every step's time, in order: a median can hide two kinds of step.
        out["step_samples"] = [round(g * 1e3, 2) for g in gaps]
        # Inside launch too (when timed): on the H200 every third or fourth B = 4-8 step is
        # ~15 ms longer, inside `async_eval` (MLX waits there for the device to catch up).
        for part in ("launch", "forward", "async_eval", "wait"):
            if self.samples.get(part):
                out[f"{part}_samples"] = [round(v * 1e3, 2) for v in self.samples[part]]
        return out


class ModuleProxy:
    """A stand-in for a module whose attributes can be wrapped one by one."""

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name: str):
        return getattr(self._module, name)


@contextlib.contextmanager
def variant(name: str):
    """locals as shipped; without compiled graphs; with compiled seams, not whole steps; whole
    steps storing K/V with a scatter (not from the head kernel); or with MLX's own matmuls only."""
    from locals.engine.forward import forward
    from locals.engine.forward.compiled import seams_only
    from locals.engine.kernels import mlx_ops_only
    from locals.engine.kernels.headprep import scattered

    limit = forward.COMPILE_MAX_TOKENS
    if name == "no-compile":
        forward.COMPILE_MAX_TOKENS = 0
    switches = {"mlx-ops": mlx_ops_only, "seams": seams_only, "scatter": scattered}
    try:
        with switches.get(name, contextlib.nullcontext)():
            yield
    finally:
        forward.COMPILE_MAX_TOKENS = limit


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
                    help="which of locals, seams, scatter, no-compile, mlx-ops to run")
    args = ap.parse_args()

    from locals.engine.engine import Engine
    from locals.engine.settings import EngineConfig

    ours, _theirs, label = load_pair(args.random_model)
    ours = no_eos(ours)
    engine = Engine(ours, EngineConfig(prefix_cache_bytes=0, max_batch=256, speculate=False))
    clock = StepClock(engine.runner, engine)
    engine.start()
    rows, path = [], None
    try:
        for batch in [int(b) for b in args.batches.split(",")]:
            ps = ragged(prompts(ours.tokenizer, batch, args.prompt_len + args.length_spread, seed=batch),
                        args.prompt_len, args.length_spread)
            row = {"batch": batch}
            for name in args.variants.split(","):
                if name == "mlx-ops" and not engine.patched_layers:
                    continue
                with variant(name):
                    run_locals(engine, ps, 8)  # warm-up: shapes compiled
                    clock.reset()
                    result = run_locals(engine, ps, args.tokens)
                row[name] = {**clock.report(), "decode_tps": round(result["decode_tps"], 1)}
            rows.append(row)
            print(f"B={batch:3d} " + "  ".join(f"{k}: {brief(v)}" for k, v in row.items() if k != "batch"),
                  flush=True)
            # After each batch size: a run cut short keeps what it measured.
            path = write_results("step_profile", {"model": label, "tokens": args.tokens, "rows": rows,
                                                  "prompt_len": args.prompt_len, "length_spread": args.length_spread,
                                                  "tuned_layers": engine.patched_layers}, path)
    finally:
        engine.stop()
    print(f"results: {path}")


if __name__ == "__main__":
    main()
