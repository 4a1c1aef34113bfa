"""What forced tokens and drafts add to a decode pass: B rows in the decode batch, where C of
them bring K tokens (a forced chunk or a draft to verify) instead of one.

Times the engine's forward pass plus reading its logits, evaluated synchronously, for the
pure decode pass and the mixed one, interleaved over rounds; median and range in ms, and
the mixed pass's extra time per extra token.
    python benchmarks/mixed_pass.py [--random-model qwen3-4b] [--batch 8] [--chunk-rows 4] [--chunk 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlx.core as mx  # noqa: E402

from benchmarks.common import load_pair, write_results  # noqa: E402
from locals.engine.load.backend import needs_fast_blas_reexec, reexec_with_fast_blas  # noqa: E402
from locals.engine.forward.forward import CompiledBlocks, RowInput, forward  # noqa: E402
from locals.engine.forward.kv import DecodeBatch, RowKV  # noqa: E402


def decode_batch(model, batch: int, context: int) -> list[RowKV]:
    """`batch` rows of `context` tokens each, resident in one DecodeBatch."""
    n_layers = len(model.layers)
    shared = DecodeBatch(n_layers)
    kvs = [RowKV(n_layers, shared) for _ in range(batch)]
    prompt = [RowInput(mx.array([(7 * i + j) % 200 + 10 for j in range(context)]), context, kv, False)
              for i, kv in enumerate(kvs)]
    mx.eval(forward(model, prompt))
    mx.eval(forward(model, [RowInput(mx.array([11]), 1, kv, False) for kv in kvs]))
    return kvs


def timed_pass(model, kvs: list[RowKV], chunk_rows: int, chunk: int, compiled: CompiledBlocks) -> float:
    """Seconds for one pass (built, evaluated, logits read), then the rows are trimmed back."""
    rows = [RowInput(mx.array([12] * (chunk if i < chunk_rows else 1)), chunk if i < chunk_rows else 1, kv,
                     True, logits=chunk if i < chunk_rows else 1) for i, kv in enumerate(kvs)]
    start = time.perf_counter()
    logits = forward(model, rows, compiled)
    mx.eval(mx.argmax(logits, axis=-1))
    elapsed = time.perf_counter() - start
    for r in rows:
        r.kv.trim(r.n)
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--random-model", default=None, help="qwen3-4b on a GPU; default: the embedded model")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--chunk-rows", type=int, default=4)
    ap.add_argument("--chunk", type=int, default=4)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    if needs_fast_blas_reexec():
        reexec_with_fast_blas()  # the CPU numbers assume OpenBLAS, like the CLI
    loaded, _theirs, label = load_pair(args.random_model)
    model = loaded.model
    kvs = decode_batch(model, args.batch, args.context)
    compiled = CompiledBlocks()
    cases = {"decode": 0, "mixed": args.chunk_rows}
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for name, rows in cases.items():  # warm-up: compile each shape
        timed_pass(model, kvs, rows, args.chunk, compiled)
    for _ in range(args.rounds):
        for name, rows in cases.items():
            samples[name].append(timed_pass(model, kvs, rows, args.chunk, compiled) * 1e3)
    med = {k: statistics.median(v) for k, v in samples.items()}
    extra_tokens = args.chunk_rows * (args.chunk - 1)
    result = {"model": label, "batch": args.batch, "chunk_rows": args.chunk_rows, "chunk": args.chunk,
              "context": args.context, "rounds": args.rounds,
              **{f"{k}_ms": {"median": round(med[k], 3), "min": round(min(v), 3), "max": round(max(v), 3)}
                 for k, v in samples.items()},
              "mixed_over_decode": round(med["mixed"] / med["decode"], 3),
              "ms_per_extra_token": round((med["mixed"] - med["decode"]) / extra_tokens, 3)}
    for k, v in result.items():
        print(f"{k:22s} {v}")
    print(f"results: {write_results('mixed_pass', result)}")


if __name__ == "__main__":
    main()
