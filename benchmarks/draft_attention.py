"""Attention of decode rows that bring several tokens: MLX's fused attention against the composed one.

A batch row verifying a prompt-lookup draft, or taking the tokens a grammar forces, brings several
queries; the batch pads them to the widest row and masks (forward/batch_plan.py). On CUDA MLX 0.32
sends such an attention to cuDNN, which builds a graph for each new key length t, while the engine
composes it instead (chunk_attention.composed_attention; docs/benchmarks-log.md, "Drafts and forced
tokens on CUDA"). This times both at agents' shapes, bfloat16, 32 query heads on 8 key heads of 128:
for each (rows, width, t) the first call (a new shape) and the mean of 36 calls (a step's layers).
    python benchmarks/draft_attention.py [--cases 8x5x3000,8x5x3001,8x17x3000,8x5x16000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlx.core as mx  # noqa: E402

from benchmarks.common import write_results  # noqa: E402
from locals.engine.forward.chunk_attention import composed_attention  # noqa: E402

HEADS, KV_HEADS, DIM, LAYERS = 32, 8, 128, 36
DEFAULT_CASES = "8x5x3000,8x5x3001,8x5x3002,8x5x3001,8x17x3000,8x17x3017,8x2x8000,8x2x8002,8x5x16000,8x5x16005"


def ms_per_call(fn, calls: int) -> float:
    """Wall ms a call of `fn`, `calls` of them evaluated together."""
    mx.synchronize()
    start = time.perf_counter()
    mx.eval([fn() for _ in range(calls)])
    mx.synchronize()
    return round((time.perf_counter() - start) * 1e3 / calls, 3)


def time_case(rows: int, width: int, t: int) -> dict:
    q = mx.random.normal((rows, HEADS, width, DIM)).astype(mx.bfloat16)
    kv = mx.random.normal((rows, KV_HEADS, t, DIM)).astype(mx.bfloat16)
    visible = mx.random.uniform(shape=(rows, 1, width, t)) < 0.9
    mx.eval(q, kv, visible)
    fused = lambda: mx.fast.scaled_dot_product_attention(q, kv, kv, scale=DIM ** -0.5, mask=visible)  # noqa: E731
    composed = lambda: composed_attention(q, kv, kv, DIM ** -0.5, visible)  # noqa: E731
    return {"rows": rows, "width": width, "t": t,
            "fused_first_ms": ms_per_call(fused, 1), "fused_layer_ms": ms_per_call(fused, LAYERS),
            "composed_first_ms": ms_per_call(composed, 1), "composed_layer_ms": ms_per_call(composed, LAYERS)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=DEFAULT_CASES, help="rows x width x t, comma-separated, in order")
    args = ap.parse_args()
    mx.eval(mx.zeros((1,)))
    results = []
    print("rows width     t | fused: first, a layer | composed: first, a layer (ms)")
    for case in args.cases.split(","):
        row = time_case(*(int(v) for v in case.split("x")))
        results.append(row)
        print(f"{row['rows']:4d} {row['width']:5d} {row['t']:5d} | {row['fused_first_ms']:8.2f} "
              f"{row['fused_layer_ms']:7.3f} | {row['composed_first_ms']:8.2f} {row['composed_layer_ms']:7.3f}")
    print("results:", write_results("draft_attention", {"cases": results}))


if __name__ == "__main__":
    main()
