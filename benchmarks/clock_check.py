"""Device stamps vs the host clock for one layer shape: what tuning's timer reads (CUDA only).

Times MLX's quantized matmul and the named candidates (no verification: run the kernel
tests or `locals tune` for that) on one (n, k) at each row count, chained as tuning chains
them, with both clocks, interleaved. Run it under Nsight Compute to set the stamps beside
the profiler's per-kernel durations:

    python benchmarks/clock_check.py --shape 2560x9728 --rows 1,8 --only cuda-qmma-r16-t256
    ncu --metrics gpu__time_duration.sum --csv python benchmarks/clock_check.py --rounds 2 ...
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx.core as mx  # noqa: E402

from benchmarks.common import interleaved, summary, write_results  # noqa: E402
from locals.engine.kernels.tuning import clock  # noqa: E402
from locals.engine.kernels.reference import cold_problems, quantized_matmul, rotating  # noqa: E402
from locals.engine.kernels.tuning.tuner import MLX_OP, current_chip, default_candidates, wall_time  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="2560x9728", help="n x k of the weight")
    parser.add_argument("--rows", default="1,8")
    parser.add_argument("--only", default="cuda-qmma-r16-t256", help="comma-separated candidate names")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    dtype = getattr(mx, args.dtype)
    device_timer = clock.timer(dtype)
    if device_timer is None:
        raise SystemExit("device stamps need the CUDA backend")
    kind, chip = current_chip()
    names = set(args.only.split(","))
    cands = [c for c in default_candidates(kind) if c.name in names]
    n, k = (int(v) for v in args.shape.split("x"))
    rows_out = []
    for m in (int(r) for r in args.rows.split(",")):
        x, copies = cold_problems(m, n, k, 4, 64, dtype)
        turn = itertools.cycle(copies)
        fns = {name: rotating(fn, x, copies, 64, 4, turn) for name, fn in [(MLX_OP, quantized_matmul),
               *((c.name, c) for c in cands if c.supports(m, 4, 64, dtype, dtype))]}
        calls = clock.calls_per_graph()
        timers = {f"{name} {kind_}": (lambda fn=fn, t=t: {"us": t(fn, calls) * 1e6})
                  for name, fn in fns.items() for kind_, t in (("device", device_timer), ("host", wall_time))}
        samples = interleaved(args.rounds, timers)
        for label, runs in samples.items():
            stats = summary([s["us"] for s in runs])
            rows_out.append({"rows": m, "timer": label, **stats})
            print(f"{n}x{k} M={m:2d} {label:34s} {stats['median']:8.2f} us [{stats['min']:.2f}-{stats['max']:.2f}]",
                  flush=True)
    path = write_results("clock_check", {"chip": chip, "shape": args.shape, "calls_per_sample": clock.calls_per_graph(),
                                         "rows": rows_out})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
