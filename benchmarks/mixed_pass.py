"""What a decode pass costs with more than one token a row in it: B rows in the decode batch,
where C of them bring K tokens (a forced chunk or a draft to verify) instead of one; or, with
`--prompt N[,N...]`, what a prompt's N-token chunk read beside the B rows (on its own cache, after
`--prompt-at` cached tokens) adds, for each N, the model set up as an engine serves it.

Times the engine's forward pass plus reading its logits, evaluated synchronously, interleaved
over rounds; median and range in ms. Decode-batch chunks: the pure decode pass, the mixed one,
and the mixed pass's extra time per extra token. A prompt chunk: the decode pass, the chunk
alone, the two in one pass (the chunk at the same length each time; and advancing as a served
prompt's does, new shapes every pass, its caches growing by mlx-lm's 256 positions or with room
for the prompt reserved as the engine does; each with its Python build and queue time apart),
the chunk's attention on its own for every layer (random queries and keys of its shape) as
served (forward/chunk_attention.py: on CUDA bucketed or composed by its size), composed, and
through MLX's fused attention (cuDNN on CUDA, its graph built in the warm-up), which tells the
attention's share, and every layer's matmuls on B + N
random tokens (joined q/k/v, o, joined gate/up, down), which tell theirs.
    python benchmarks/mixed_pass.py [--random-model qwen3-4b] [--batch 8] [--chunk-rows 4] [--chunk 4]
    python benchmarks/mixed_pass.py --random-model qwen3-4b --batch 8 --context 6000 --prompt 24,56,120,248 --prompt-at 4096
        [--compile-max-tokens 320]
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
from locals.engine.forward import chunk_attention  # noqa: E402
from locals.engine.forward.forward import CompiledBlocks, RowInput, forward  # noqa: E402
from locals.engine.forward.kv import ROOM_STEP, DecodeBatch, RowKV  # noqa: E402


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


def prompt_cache(model, at: int) -> RowKV:
    """A prompt's own cache holding its first `at` tokens, as a prompt is read beside the batch."""
    kv = RowKV(len(model.layers))
    if at:
        mx.eval(forward(model, [RowInput(mx.array([(5 * j) % 200 + 10 for j in range(at)]), at, kv, False)]))
    return kv


def timed_prompt_pass(runner, kvs: list[RowKV], prompt: RowKV | None, chunk: int, advance: bool = False,
                      parts: dict | None = None) -> float:
    """Seconds for one pass of the decoding rows `kvs` and a `chunk`-token piece of `prompt`
    (either may be absent); then every cache is trimmed back, except the prompt's with `advance`
    (its next chunk comes at a new length, as a served prompt's does). `parts` collects the ms spent
    building the pass in Python and queuing it (`mx.async_eval`), apart from the rest."""
    rows = [RowInput(mx.array([11]), 1, kv, True) for kv in kvs]
    if prompt is not None:
        rows.append(RowInput(mx.array([13] * chunk), chunk, prompt, True))
    start = time.perf_counter()
    tokens = mx.argmax(forward(runner.model, rows, runner.compiled, runner.choices), axis=-1)
    built = time.perf_counter()
    mx.async_eval(tokens)
    queued = time.perf_counter()
    mx.eval(tokens)
    elapsed = time.perf_counter() - start
    if parts is not None:
        parts.setdefault("build", []).append((built - start) * 1e3)
        parts.setdefault("queue", []).append((queued - built) * 1e3)
    for r in rows:
        if not (advance and r.kv is prompt):
            r.kv.trim(r.n)
    return elapsed


def timed_chunk_attention(model, chunk: int, at: int, attend) -> float:
    """Seconds for `attend(q, keys, values, scale, buffers)` once per layer on random data of a
    `chunk`-token piece after `at` cached tokens, in the model's heads and dtype, the keys and values
    the first positions of buffers sized as a served prompt's (kv.ROOM_STEP positions at a time)."""
    attn = model.layers[0].self_attn
    heads, kv_heads = attn.n_heads, attn.n_kv_heads
    dim, dtype = round(attn.scale ** -2), model.layers[0].input_layernorm.weight.dtype  # scale = dim ** -0.5
    q = mx.random.normal((1, heads, chunk, dim)).astype(dtype)
    positions = -(-(at + chunk) // ROOM_STEP) * ROOM_STEP
    buffers = [mx.random.normal((1, kv_heads, positions, dim)).astype(dtype) for _ in range(2)]
    keys, values = (b[:, :, : at + chunk] for b in buffers)
    mx.eval(q, keys, values, buffers)
    start = time.perf_counter()
    mx.eval([attend(q, keys, values, attn.scale, buffers) for _ in model.layers])
    return time.perf_counter() - start


def timed_matmuls(model, tokens: int) -> float:
    """Seconds for every layer's matmuls (joined q/k/v, o, joined gate/up, down where joined;
    the parts otherwise) on `tokens` random rows, as a pass of that many tokens runs them."""
    layers = model.layers
    hidden = layers[0].input_layernorm.weight
    x = mx.random.normal((tokens, hidden.shape[0])).astype(hidden.dtype)
    mx.eval(x)
    outs = []
    start = time.perf_counter()
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        qkv = [attn.fused_qkv] if "fused_qkv" in attn else [attn.q_proj, attn.k_proj, attn.v_proj]
        gate_up = [mlp.fused_gate_up] if "fused_gate_up" in mlp else [mlp.gate_proj, mlp.up_proj]
        outs += [f(x) for f in qkv + gate_up]
        outs.append(attn.o_proj(mx.zeros((tokens, attn.o_proj.weight.shape[1] * _packing(attn.o_proj)), x.dtype)))
        outs.append(mlp.down_proj(mx.zeros((tokens, mlp.down_proj.weight.shape[1] * _packing(mlp.down_proj)),
                                           x.dtype)))
    mx.eval(outs)
    return time.perf_counter() - start


def _packing(linear) -> int:
    """Input features per stored weight column: 32 // bits for a quantized linear, else 1."""
    bits = getattr(linear, "bits", None)
    return 32 // bits if bits else 1


def prompt_cases(loaded, args) -> dict:
    """For each chunk size ("chunks"): the decode pass, the prompt chunk alone and beside it, the
    chunk's attention both ways and the pass's matmuls, on a model set up as the engine serves it
    (an engine built, never started); and how that model's q/k/v layer routes row counts ("routes":
    tuned kernels, and the dense matmul wide passes take)."""
    from locals.engine.engine import Engine
    from locals.engine.forward.choices import ForwardChoices
    from locals.engine.settings import EngineConfig

    forward = ForwardChoices() if args.compile_max_tokens is None else ForwardChoices(
        compile_max_tokens=args.compile_max_tokens)
    runner = Engine(loaded, EngineConfig(prefix_cache_bytes=0, forward=forward)).runner
    kvs, prompt = decode_batch(runner.model, args.batch, args.context), prompt_cache(runner.model, args.prompt_at)

    def fused(q, keys, values, scale, _buffers):
        return mx.fast.scaled_dot_product_attention(q, keys, values, scale=scale, mask="causal")

    def composed(q, keys, values, scale, _buffers):
        return chunk_attention.composed_attention(q, keys, values, scale)

    results = []
    for n in args.prompt:
        moving, reserved = prompt_cache(runner.model, args.prompt_at), prompt_cache(runner.model, args.prompt_at)
        reserved.reserve(args.prompt_at + (args.rounds + 1) * n)  # as the engine does for a whole prompt
        parts = {"mixed": {}, "mixed, chunk advancing": {}, "mixed, chunk advancing, room reserved": {}}
        cases = {"decode": lambda: timed_prompt_pass(runner, kvs, None, n),
                 "prompt": lambda: timed_prompt_pass(runner, [], prompt, n),
                 "mixed": lambda: timed_prompt_pass(runner, kvs, prompt, n, parts=parts["mixed"]),
                 "mixed, chunk advancing": lambda: timed_prompt_pass(runner, kvs, moving, n, advance=True,
                                                                     parts=parts["mixed, chunk advancing"]),
                 "mixed, chunk advancing, room reserved": lambda: timed_prompt_pass(
                     runner, kvs, reserved, n, advance=True, parts=parts["mixed, chunk advancing, room reserved"]),
                 "chunk attention, as served": lambda: timed_chunk_attention(
                     runner.model, n, args.prompt_at, chunk_attention.chunk_attention),
                 "chunk attention, fused": lambda: timed_chunk_attention(runner.model, n, args.prompt_at, fused),
                 "chunk attention, composed": lambda: timed_chunk_attention(runner.model, n, args.prompt_at, composed),
                 "matmuls, decode rows and chunk": lambda: timed_matmuls(runner.model, args.batch + n)}
        samples: dict[str, list[float]] = {name: [] for name in cases}
        for case in cases.values():  # warm-up: kernels, graphs, cuDNN builds
            case()
        for _ in range(args.rounds):
            for name, case in cases.items():
                samples[name].append(case() * 1e3)
        samples.update({f"{case}, {part}": v[1:] for case, by_part in parts.items() for part, v in by_part.items()})
        results.append({"prompt": n, "prompt_at": args.prompt_at, **{
            f"{k}_ms": {"median": round(statistics.median(v), 3), "min": round(min(v), 3), "max": round(max(v), 3)}
            for k, v in samples.items()}})
        print(results[-1], flush=True)
    return {"routes": repr(getattr(runner.model.layers[0].self_attn.fused_qkv, "_routes", None)), "chunks": results}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--random-model", default=None, help="qwen3-4b on a GPU; default: the embedded model")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--chunk-rows", type=int, default=4)
    ap.add_argument("--chunk", type=int, default=4)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--prompt", type=lambda v: [int(n) for n in v.split(",")], default=[],
                    help="prompt chunks of these many tokens beside the batch, one at a time (e.g. 24,56,120,248)")
    ap.add_argument("--prompt-at", type=int, default=4096, help="the prompt's tokens cached before that chunk")
    ap.add_argument("--compile-max-tokens", type=int, default=None,
                    help="with --prompt: passes up to this many tokens run as compiled seams (default: the engine's)")
    args = ap.parse_args()
    if needs_fast_blas_reexec():
        reexec_with_fast_blas()  # the CPU numbers assume OpenBLAS, like the CLI
    loaded, _theirs, label = load_pair(args.random_model)
    if args.prompt:
        result = {"model": label, "batch": args.batch, "context": args.context, "rounds": args.rounds,
                  "compile_max_tokens": args.compile_max_tokens, **prompt_cases(loaded, args)}
        for k, v in result.items():
            print(f"{k:24s} {v}")
        print(f"results: {write_results('mixed_pass', result)}")
        return
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
