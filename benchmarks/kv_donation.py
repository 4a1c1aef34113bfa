"""Does writing a decode step's K/V copy the whole cache when the step before is still running?

MLX updates an array in place only when nothing else holds its buffer ("donation"); a
kernel queued but not finished keeps its inputs' buffers alive until it completes. With
pipelining, step n+1's K/V write is queued while step n, which read the cache, may still
run, so the write may copy the whole (rows, kv_heads, T, head_dim) array. This times the
engine's own `DecodeBatch.write` after a step that reads the cache, with that step
finished first (synced) or still queued (pipelined), and reports MLX's peak memory above
the cache itself: a copy shows as about one cache array per step in flight.
    python benchmarks/kv_donation.py [--tokens 4096] [--steps 10] [--work 8192 on a GPU]
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
from locals.engine.forward.kv import DecodeBatch, RowKV  # noqa: E402

ROWS, KV_HEADS, HEAD_DIM = 8, 8, 128


def filled_batch(tokens: int) -> tuple[DecodeBatch, list[RowKV]]:
    """One layer of decode batch holding ROWS rows of `tokens` positions each."""
    batch = DecodeBatch(1)
    rows = []
    for _ in range(ROWS):
        row = RowKV(1, batch)
        k = mx.zeros((1, KV_HEADS, tokens, HEAD_DIM), mx.float16)
        row.layers[0].update_and_fetch(k, k)
        batch.join(row)
        rows.append(row)
    mx.eval(batch.kv)
    return batch, rows


def _read_step(batch: DecodeBatch, t: int, q: mx.array, work: mx.array) -> mx.array:
    """A step's reads of the cache (its views go out of scope here, as in the engine)."""
    keys, values = batch.view(0, t, None)
    return mx.fast.scaled_dot_product_attention(q, keys, values, scale=0.1).sum() + (work @ work).sum()


def run(batch: DecodeBatch, rows: list[RowKV], steps: int, pipelined: bool, work: mx.array) -> dict:
    """`steps` of: attention over the cache plus `work` (the rest of a step), then the next K/V write."""
    lengths = np.array([r.length for r in rows], np.int32)
    rows_at = np.concatenate([np.arange(ROWS), np.arange(ROWS) + batch.rows_cap]).astype(np.int32)
    index = (mx.array(rows_at[:, None, None]), mx.array(np.arange(KV_HEADS, dtype=np.int32)[None, :, None]),
             mx.array(np.concatenate([lengths, lengths])[:, None, None]))
    new = mx.ones((2 * ROWS, KV_HEADS, 1, HEAD_DIM), mx.float16)
    q = mx.ones((ROWS, KV_HEADS, 1, HEAD_DIM), mx.float16)
    mx.eval(new, q, *index)
    mx.synchronize()
    mx.reset_peak_memory()
    base = mx.get_active_memory()
    start = time.perf_counter()
    for _ in range(steps):
        step = _read_step(batch, int(lengths.max()), q, work)
        mx.async_eval(step) if pipelined else mx.eval(step)
        batch.write(0, index, new)
        mx.async_eval(batch.kv[0])
    mx.eval(batch.kv[0], step)
    return {"s_per_step": (time.perf_counter() - start) / steps, "peak_above_mb": (mx.get_peak_memory() - base) / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096, help="positions held per row")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", type=int, default=1024,
                    help="side of the matmul standing for the rest of a step (8192 keeps a GPU busy)")
    args = ap.parse_args()
    batch, rows = filled_batch(args.tokens)
    work = mx.random.normal((args.work, args.work))  # the rest of a step, so a queued one is still running
    mx.eval(work)
    cache_mb = batch.kv[0].nbytes / 2**20
    results = {"synced": [], "pipelined": []}
    for _ in range(args.rounds):
        for name in results:
            results[name].append(run(batch, rows, args.steps, name == "pipelined", work))
    for name, runs in results.items():
        peak = statistics.median(r["peak_above_mb"] for r in runs)
        step = statistics.median(r["s_per_step"] for r in runs)
        print(f"{name:9s}  peak above the cache {peak:8.1f} MB  {step * 1e3:7.2f} ms/step  "
              f"(one K array: {cache_mb:.1f} MB), medians of {len(runs)}")
    print("wrote", write_results("kv_donation", {"tokens": args.tokens, "rows": ROWS, "kv_heads": KV_HEADS,
                                                  "head_dim": HEAD_DIM, "steps": args.steps, "work": args.work,
                                                  "one_array_mb": cache_mb,
                                                  "runs": results}))


if __name__ == "__main__":
    main()
