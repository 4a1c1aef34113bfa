"""Where a B-row decode step's device time goes, in MLX itself: each part timed on its own.

For a random Qwen3-shaped 4-bit model, at each batch size B, evaluated synchronously (the
device's time, no pipelining): mlx-lm's whole model step (batched KVCache, argmax), and
each part of it repeated for every layer as one graph: the seven quantized matmuls (on
mlx-lm's (B, 1, hidden) input, and on the engine's flat (B, hidden) one), the
attention call over a context, the K/V scatter write the engine makes, the norms/rope,
and the lm_head; plus the cost of an empty kernel (a chain of tiny adds). A part whose
time grows with B while the weights read stay the same is where batching loses. The parts'
ops do not depend on each other, so a GPU may run them side by side: a kernel that keeps
few SMs busy looks cheaper here than inside a model (MLX's 8-row matmuls: 3.8 ms here,
13.2 ms inside an engine step); benchmarks/step_kernels.py times the model's own chain.
    python benchmarks/step_parts.py --random-model qwen3-4b [--batches 1,4,8,16] [--context 96]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlx.core as mx  # noqa: E402

from benchmarks.common import QWEN3_SHAPES, load_pair, write_results  # noqa: E402


def timed(fn, repeats: int) -> dict:
    """Median/min/max milliseconds of `fn()` evaluated synchronously, after two warm-ups."""
    for _ in range(2):
        mx.eval(fn())
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        mx.eval(fn())
        samples.append((time.perf_counter() - t) * 1e3)
    return {"median": round(statistics.median(samples), 3), "min": round(min(samples), 3),
            "max": round(max(samples), 3)}


def whole_step(model, b: int, context: int):
    """mlx-lm's own step: (B, 1) tokens through the model with a filled batched cache, argmax."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    mx.eval(model(mx.zeros((b, context), dtype=mx.int32), cache=cache))
    token = mx.zeros((b, 1), dtype=mx.int32)

    def step():
        for c in cache:  # stay at the same length every repeat
            c.offset = context
        return mx.argmax(model(token, cache=cache)[:, -1], axis=-1)
    return step


def matmul_parts(layers, b: int, x: mx.array, x_mid: mx.array, x_o: mx.array) -> dict:
    """Every layer's seven quantized matmuls, on mlx-lm's (B, 1, ...) inputs and on the
    engine's flat (B, ...) ones (one (tokens, hidden) matrix)."""
    def run(h, mid, o):
        out = []
        for layer in layers:
            a, m = layer.self_attn, layer.mlp
            out += [a.q_proj(h), a.k_proj(h), a.v_proj(h), a.o_proj(o), m.gate_proj(h), m.up_proj(h), m.down_proj(mid)]
        return out

    flat = (x.reshape(b, -1), x_mid.reshape(b, -1), x_o.reshape(b, -1))
    return {"matmuls": lambda: run(x, x_mid, x_o), "matmuls_flat": lambda: run(*flat)}


def parts(model, b: int, context: int) -> dict:
    """The step's parts, each for every layer in one graph, as zero-argument callables."""
    layers = model.model.layers
    args = model.args
    hidden, heads, kv_heads, dim = args.hidden_size, args.num_attention_heads, args.num_key_value_heads, args.head_dim
    normal = lambda *shape: mx.random.normal(shape).astype(mx.bfloat16)  # noqa: E731
    x, q, k_new = normal(b, 1, hidden), normal(b, heads, 1, dim), normal(b, kv_heads, 1, dim)
    keys, values = normal(b, kv_heads, context, dim), normal(b, kv_heads, context, dim)
    x_mid, x_o = normal(b, 1, args.intermediate_size), normal(b, 1, heads * dim)
    caches = [mx.zeros((b, kv_heads, 256, dim), dtype=mx.bfloat16) for _ in range(2 * len(layers))]
    index = (mx.arange(b)[:, None, None], mx.arange(kv_heads)[None, :, None], mx.full((b, 1, 1), context, mx.int32))
    mx.eval(x, q, keys, values, k_new, caches, x_mid, x_o)

    def kv_write():
        for c in caches:
            c[index] = k_new
        return caches

    def norms_rope():
        out = []
        for layer in layers:
            h = layer.post_attention_layernorm(layer.input_layernorm(x) + x)
            qn = layer.self_attn.rope(layer.self_attn.q_norm(q), offset=context)
            out += [h, qn, layer.self_attn.k_norm(k_new)]
        return out

    def empty_kernels():
        y = mx.zeros((b, 16))
        for _ in range(len(layers) * 25):
            y = y + 1
        return y

    return {"whole_step": whole_step(model, b, context), **matmul_parts(layers, b, x, x_mid, x_o),
            "attention": lambda: [mx.fast.scaled_dot_product_attention(q, keys, values, scale=dim ** -0.5)
                                  for _ in layers],
            "kv_write": kv_write, "norms_rope": norms_rope,
            "lm_head": lambda: model.model.embed_tokens.as_linear(x),
            f"empty_kernels_x{len(layers) * 25}": empty_kernels}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--random-model", default="qwen3-4b", choices=sorted(QWEN3_SHAPES))
    ap.add_argument("--batches", default="1,4,8,16")
    ap.add_argument("--context", type=int, default=96, help="tokens already in each row's cache")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    loaded, _, label = load_pair(args.random_model)
    rows = []
    for b in (int(v) for v in args.batches.split(",")):
        row = {"batch": b}
        for name, fn in parts(loaded.model, b, args.context).items():
            row[name] = timed(fn, args.repeats)
        rows.append(row)
        print(f"B={b:3d} " + "  ".join(f"{k} {v['median']:.2f}" for k, v in row.items() if k != "batch") + "  (ms)")
    path = write_results("step_parts", {"model": label, "context": args.context, "repeats": args.repeats, "rows": rows})
    print("results:", path)


if __name__ == "__main__":
    main()
