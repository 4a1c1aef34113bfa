"""Microbenchmark: each small-batch kernel candidate vs `mx.quantized_matmul`, per rows M and shape.

Candidates are verified first (fresh random data, odd shapes); only verified ones are
timed. Rounds interleave all variants (rotating order), every sample is kept, and the
table shows medians with the range. Default shapes are Qwen3-4B's MLP and a square
2560 projection, 4-bit, group 64, bfloat16. JSON goes to benchmarks/results/.

    python benchmarks/kernels.py [--rows 1-16] [--bits 4] [--rounds 9] [--only qmma,qmvk] [--clock device] [--out DIR]
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx.core as mx  # noqa: E402

from benchmarks.common import interleaved, summary, write_results  # noqa: E402
from locals.cli.tune import _parse_rows  # noqa: E402  (the same "1-16" / "1,2,8-16" as `locals tune --rows`)
from locals.engine.kernels.tuning import clock  # noqa: E402
from locals.engine.kernels.reference import cold_problems, quantized_matmul, rotating  # noqa: E402
from locals.engine.kernels.tuning.tuner import MLX_OP, current_chip, default_candidates  # noqa: E402
from locals.engine.kernels.tuning.verify import default_cases, passes, verify  # noqa: E402

SHAPES = ((9728, 2560), (2560, 9728), (2560, 2560))


def _verified(candidates, bits: int, group: int, dtype) -> tuple[list, dict]:
    kept, rejected = [], {}
    for cand in candidates:
        verdicts = verify(cand, default_cases(bits, group, dtype))
        if passes(verdicts):
            kept.append(cand)
        else:
            bad = next((v for v in verdicts if not v.ok), None)
            rejected[cand.name] = f"{bad.case.describe()}: {bad.reason}" if bad else "unsupported"
    return kept, rejected


def _timer(fn, repeats: int, device_timer=None):
    """One sample: host time of `repeats` chained calls, or with `device_timer` (CUDA) the
    device time between two stamps of as many calls as one CUDA graph holds."""
    def run() -> dict:
        if device_timer is not None:
            return {"us": device_timer(fn, clock.calls_per_graph()) * 1e6}
        start = time.perf_counter()
        mx.eval([fn() for _ in range(repeats)])
        return {"us": (time.perf_counter() - start) / repeats * 1e6}
    return run


def bench_shape(n: int, k: int, rows: list[int], cands: list, args) -> list[dict]:
    """Per M: every variant's samples (µs per call), median and range."""
    out = []
    for m in rows:
        # Weights read from memory, as in a model's step: calls rotate through copies.
        x, copies = cold_problems(m, n, k, args.bits, args.group_size, args.dtype)
        usable = [c for c in cands if c.supports(m, args.bits, args.group_size, args.dtype, args.dtype)]
        turn = itertools.cycle(copies)
        fns = {name: rotating(fn, x, copies, args.group_size, args.bits, turn)
               for name, fn in [(MLX_OP, quantized_matmul), *((c.name, c) for c in usable)]}
        repeats = max(args.repeats, len(copies))
        device_timer = clock.timer(args.dtype) if args.clock == "device" else None
        if args.clock == "device" and device_timer is None:
            raise SystemExit("--clock device needs the CUDA backend (device timestamps); use --clock host")
        samples = interleaved(args.rounds, {name: _timer(fn, repeats, device_timer) for name, fn in fns.items()})
        stats = {name: {**summary([s["us"] for s in runs]), "samples": [round(s["us"], 2) for s in runs]}
                 for name, runs in samples.items()}
        best = min((s for s in stats if s != MLX_OP), key=lambda s: stats[s]["median"], default=MLX_OP)
        out.append({"rows": m, "best": best, "variants": stats})
        mlx_us, best_us = stats[MLX_OP]["median"], stats[best]["median"]
        print(f"{n}x{k} M={m:2d}  mlx {mlx_us:8.1f} us  [{stats[MLX_OP]['min']:.1f}-{stats[MLX_OP]['max']:.1f}]"
              f"   best {best:22s} {best_us:8.1f} us  [{stats[best]['min']:.1f}-{stats[best]['max']:.1f}]"
              f"   x{mlx_us / best_us:.2f}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1-16", help="row counts M, e.g. 1-16, 8 or 1,2,4,8")
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--repeats", type=int, default=50, help="calls evaluated together per sample")
    parser.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES))
    parser.add_argument("--clock", choices=("host", "device"), default="host",
                        help="host: wall time of chained calls; device: CUDA timestamps around them")
    parser.add_argument("--only", default="", help="comma-separated parts of candidate names to keep, e.g. qmma,qmvk")
    parser.add_argument("--out", type=Path, help="also copy the JSON here")
    args = parser.parse_args()
    args.dtype = getattr(mx, args.dtype)
    kind, chip = current_chip()
    print(f"{chip}, MLX {mx.__version__}", flush=True)
    pool = [c for c in default_candidates(kind)
            if not args.only or any(part in c.name for part in args.only.split(","))]
    cands, rejected = _verified(pool, args.bits, args.group_size, args.dtype)
    print(f"verified: {[c.name for c in cands]}  rejected: {rejected}", flush=True)
    results = {}
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        results[shape] = bench_shape(n, k, _parse_rows(args.rows), cands, args)
    path = write_results("kernels", {
        "chip": chip, "bits": args.bits, "group_size": args.group_size, "dtype": str(args.dtype),
        "rounds": args.rounds, "repeats": args.repeats, "clock": args.clock, "verified": [c.name for c in cands],
        "rejected": rejected, "shapes": results})
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, args.out / path.name)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
