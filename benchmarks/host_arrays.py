"""What making a step's small index arrays from host data costs while the device runs a step.

Every pass the engine builds makes a few small int32 arrays from numpy (a batch plan's scatter
index, positions, the decode attention's row table; forward/batch_plan.py). Served on an H100,
making them took 5% of the engine thread's samples, inside the CUDA driver (docs/benchmarks-log.md,
"MLX's quantized-matmul tiles, built ahead"). MLX's CUDA allocator may hand a host array a freed
device buffer and move it to unified memory with a synchronous copy; whether that makes the host
wait for the queued work is what this times: the arrays made with the device idle, and while
`--work` chained matmuls run (queued, not waited for), with the allocator's cache empty, or
primed with freed device buffers of the arrays' sizes.
    python benchmarks/host_arrays.py [--sizes 64,512,4096] [--work 24] [--rounds 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.common import write_results  # noqa: E402


def busy_device(work: int, side: int) -> mx.array:
    """`work` chained (side x side) matmuls, queued: the device busy for a while."""
    a = mx.random.normal((side, side)).astype(mx.bfloat16)
    mx.eval(a)
    out = a
    for _ in range(work):
        out = out @ a
    mx.async_eval(out)
    return out


def time_host_arrays(sizes: list[int], busy: bool, primed: bool, work: int, side: int) -> dict:
    """ms to make one int32 array of each size from numpy, and to wait for the device after."""
    mx.synchronize()
    mx.clear_cache()
    if primed:  # device buffers of these sizes, freed: the allocator's cache holds them
        mx.eval([mx.arange(n, dtype=mx.int32) + 1 for n in sizes])
    pending = busy_device(work, side) if busy else None
    start = time.perf_counter()
    made = [mx.array(np.arange(n, dtype=np.int32)) for n in sizes]
    made_at = time.perf_counter()
    if pending is not None:
        mx.eval(pending)
    done = time.perf_counter()
    del made
    return {"make_ms": (made_at - start) * 1e3, "wait_after_ms": (done - made_at) * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=lambda v: [int(n) for n in v.split(",")], default=[64, 512, 4096])
    ap.add_argument("--work", type=int, default=24, help="chained matmuls that keep the device busy")
    ap.add_argument("--side", type=int, default=0, help="matmul side (default 8192 on a GPU, 256 on a CPU)")
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    side = args.side or (8192 if mx.default_device() == mx.gpu else 256)
    cases = {f"{'busy' if busy else 'idle'}, cache {'primed' if primed else 'empty'}": (busy, primed)
             for busy in (False, True) for primed in (False, True)}
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in cases}
    for name, (busy, primed) in cases.items():  # warm-up: kernels, the first allocations
        time_host_arrays(args.sizes, busy, primed, args.work, side)
    for _ in range(args.rounds):
        for name, (busy, primed) in cases.items():
            for key, value in time_host_arrays(args.sizes, busy, primed, args.work, side).items():
                samples[name].setdefault(key, []).append(value)
    results = {name: {key: {"median": round(statistics.median(v), 3), "min": round(min(v), 3),
                            "max": round(max(v), 3)} for key, v in by_key.items()}
               for name, by_key in samples.items()}
    for name, by_key in results.items():
        print(f"{name:22s} " + "  ".join(f"{k} {v['median']:.3f} ({v['min']:.3f}-{v['max']:.3f})"
                                         for k, v in by_key.items()))
    path = write_results("host_arrays", {"sizes": args.sizes, "work": args.work, "side": side,
                                         "rounds": args.rounds, "cases": results})
    print("results:", path)


if __name__ == "__main__":
    main()
