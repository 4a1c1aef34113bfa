"""The primitives one decode step queues, by name: a step as one compiled graph against compiled
seams around eager attention, at each batch size. Each primitive costs host time to build and
to queue (a step on the H200 is host-bound at small batches), so this lists what is left to fold.

Counts are the nodes of the graph handed to `mx.async_eval` in steady decoding (the median step),
read from MLX's dot export; views and reshapes count too (they cost host time, not a kernel).
    python benchmarks/step_ops.py --random-model qwen3-4b --batches 1,8
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlx.core as mx  # noqa: E402

from benchmarks.common import bench_engine, load_pair, no_eos, prompts, write_results  # noqa: E402
from benchmarks.step_profile import VARIANTS  # noqa: E402
from locals.engine.bench import run_locals  # noqa: E402

LABEL = re.compile(r'label ="([^"]+)", shape=rectangle')


class OpNames:
    """Counts each primitive name in every graph the step runner queues (its `on_queue` hook)."""

    def __init__(self):
        self.steps: list[collections.Counter] = []
        self.on = False  # counting only the measured run

    def __call__(self, *arrays) -> None:
        if self.on:
            with tempfile.NamedTemporaryFile("r", suffix=".dot") as f:
                mx.export_to_dot(f.name, *arrays)
                self.steps.append(collections.Counter(LABEL.findall(f.read())))

    def median_step(self) -> collections.Counter:
        """The step whose total sits at the median of the run's steps (steady decoding)."""
        ranked = sorted(self.steps, key=lambda c: sum(c.values()))
        return ranked[len(ranked) // 2] if ranked else collections.Counter()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--random-model", default=None, help="qwen3-4b on a GPU; qwen3-tiny tries it on a CPU")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--variants", default="locals,seams", help=f"which of {', '.join(VARIANTS)}")
    args = ap.parse_args()

    ours = no_eos(load_pair(args.random_model)[0])
    names = OpNames()
    # Engines that patch the model first: an untuned one runs on the patched model's twin.
    variants = sorted(args.variants.split(","), key=lambda n: "untuned" in VARIANTS[n])
    engines = {name: bench_engine(ours, **VARIANTS[name], on_queue=names) for name in variants}
    rows = []
    try:
        for batch in [int(b) for b in args.batches.split(",")]:
            ps = prompts(ours.tokenizer, batch, 64, seed=batch)
            for name, engine in engines.items():
                run_locals(engine, ps, args.tokens)  # traces this shape
                names.steps.clear()
                names.on = True
                run_locals(engine, ps, args.tokens)
                names.on = False
                step = names.median_step()
                rows.append({"batch": batch, "variant": name, "ops": sum(step.values()), "by_name": dict(step)})
                print(f"B={batch:3d} {name}: {sum(step.values())} ops  " +
                      ", ".join(f"{k} {v}" for k, v in step.most_common()), flush=True)
    finally:
        for engine in engines.values():
            engine.stop()
    print("results:", write_results("step_ops", {"random_model": args.random_model, "rows": rows}))


if __name__ == "__main__":
    main()
