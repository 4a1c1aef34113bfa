"""SwiGLU inside the joined gate/up kernel (qmm_mma.py, GATED) against the same kernel's plain
product followed by MLX's activation, per row count, on the device clock and the host clock
(CUDA only; no verification here: tests/kernels/test_kernels_cuda.py checks the kernel).

    python benchmarks/gated_kernel.py --shape 19456x2560 --rows 2,4,8,16 --only cuda-qmma-r16-t128
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx.core as mx  # noqa: E402
from mlx_lm.models.activations import swiglu  # noqa: E402

from benchmarks.common import interleaved, summary, write_results  # noqa: E402
from locals.engine.kernels.tuning import clock  # noqa: E402
from locals.engine.kernels.reference import cold_problems, rotating  # noqa: E402
from locals.engine.kernels.tuning.tuner import current_chip, default_candidates, wall_time  # noqa: E402


def forms(kernel):
    """name -> fn(x, w, scales, biases, group_size, bits) for the three ways to get the MLP's activation."""
    def then_swiglu(*args):
        gate, up = mx.split(kernel(*args), 2, axis=-1)
        return swiglu(gate, up)

    return {"product only": kernel, "product + MLX swiglu": then_swiglu,
            "gated": lambda *args: kernel(*args, gated=True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="19456x2560", help="n x k of the joined [gate | up] weight")
    parser.add_argument("--rows", default="2,4,8,16")
    parser.add_argument("--only", default="cuda-qmma-r16-t128", help="comma-separated candidate names")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    dtype = mx.bfloat16
    device_timer = clock.timer(dtype)
    if device_timer is None:
        raise SystemExit("device stamps need the CUDA backend")
    kind, chip = current_chip()
    names = args.only.split(",")
    kernels = [c for c in default_candidates(kind) if c.name in names and getattr(c, "takes_gated", False)]
    n, k = (int(v) for v in args.shape.split("x"))
    calls = clock.calls_per_graph()
    out = []
    for m in (int(r) for r in args.rows.split(",")):
        x, copies = cold_problems(m, n, k, 4, 64, dtype)
        turn = itertools.cycle(copies)
        timers = {}
        for kernel in (c for c in kernels if c.supports(m, 4, 64, dtype, dtype)):
            for form, fn in forms(kernel).items():
                chained = rotating(fn, x, copies, 64, 4, turn)
                for clock_name, t in (("device", device_timer), ("host", wall_time)):
                    timers[f"{kernel.name} {form} {clock_name}"] = lambda c=chained, t=t: {"us": t(c, calls) * 1e6}
        for label, runs in interleaved(args.rounds, timers).items():
            stats = summary([s["us"] for s in runs])
            out.append({"rows": m, "timer": label, **stats})
            print(f"{n}x{k} M={m:2d} {label:52s} {stats['median']:8.2f} us [{stats['min']:.2f}-{stats['max']:.2f}]",
                  flush=True)
    path = write_results("gated_kernel", {"chip": chip, "shape": args.shape, "calls_per_sample": calls, "rows": out})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
