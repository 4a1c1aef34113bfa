"""One forward pass over a ragged batch: each row brings its own new tokens and its own KV.

For llama/qwen-family models the rows' tokens are concatenated into one sequence, so
projections and MLP read the weights once for all rows. Rows in the shared `DecodeBatch`
(decoding one token, or several: forced tokens, drafts) attend in one call per layer
(batch_plan.py); prompt chunks attend per row over their own caches. Other architectures
fall back to one mlx-lm model call per row.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import mlx.core as mx
import numpy as np
from mlx_lm.models.activations import swiglu

from locals.engine.batch_plan import BatchPlan
from locals.engine.fuse import split_sizes
from locals.engine.kernels.decode_attention import active_for as attention_kernel
from locals.engine.kernels.fused import active as fused_active
from locals.engine.kernels.registry import bypassed, gated_active, swap_count
from locals.engine.kv import RowKV
from locals.engine.rowfeed import RowOf, join_rows

RAGGED_TYPES = {"llama", "mistral", "qwen2", "qwen3"}


def _default_joined_limits() -> dict[str, int]:
    """Up to how many tokens a pass runs a layer's joined matmuls (fuse.py); longer ones run
    the parts, views of the same weights (benchmarks/joined_matmuls.py compares settings).

    Every pass, on every backend. With the fused q/k kernel (kernels/headprep.py) joining won at
    every batch size on the H200 (random 4-bit Qwen3-4B, one engine, 3 interleaved rounds,
    joined_matmuls-gpu-20261130-181439.json): B = 8 1600 tok/s joined vs 1234 joined up to
    4 tokens vs 1200 parts; B = 16 2818 vs 2115 vs 2245. Without it see
    `UNFUSED_QKV_MAX_TOKENS`."""
    limit = int(os.environ.get("LOCALS_JOINED_MAX_TOKENS", 1 << 30))  # for benchmarks
    return {"fused_qkv": limit, "fused_gate_up": limit}


def _unfused_qkv_limit() -> int:
    """Up to how many tokens a pass joins q/k/v where the fused q/k kernel is not in use.

    CUDA: 4. There MLX's rms_norm copies the strided q/k slices of a joined output of several
    rows, and RoPE copies strided 4-D inputs: on the H200 without the fused kernel, joined lost
    to the parts at B = 8 in all three runs (719 vs 751, 743 vs 805, 729 vs 781 tok/s; 6 more
    copy kernels a layer under ncu) and won at B = 4 (414 vs 312, 443 vs 345). Elsewhere every
    pass: nothing has measured otherwise there (the CPU's dense path runs the same either way)."""
    cuda = getattr(mx, "cuda", None)
    return 4 if cuda is not None and cuda.is_available() else 1 << 30


JOINED_MAX_TOKENS = _default_joined_limits()
UNFUSED_QKV_MAX_TOKENS = _unfused_qkv_limit()


@dataclass
class RowInput:
    """A row's new tokens for this pass; `sample` asks for the logits after its last
    `logits` tokens (more than one when the row's tail is a draft to verify)."""

    tokens: mx.array | RowOf  # (n,) int32, may be lazy; RowOf: last step's sampled token
    n: int
    kv: RowKV
    sample: bool
    logits: int = 1


def supports_ragged(model) -> bool:
    """True when `model` is a llama/qwen-family mlx-lm model with full attention only."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if getattr(model, "model_type", None) not in RAGGED_TYPES or not layers:
        return False
    if any(getattr(layer, "use_sliding", False) for layer in layers):
        return False
    attn = layers[0].self_attn
    return all(hasattr(attn, a) for a in ("q_proj", "k_proj", "v_proj", "o_proj", "rope", "scale"))


def forward(model, rows: list[RowInput], compiled: CompiledBlocks | None = None) -> mx.array:
    """Logits (S, vocab) for the rows with `sample` set, in row order (`logits` rows each).
    With `compiled` (the engine's), short passes run each layer's halves as compiled graphs."""
    if supports_ragged(model):
        return _ragged(model, rows, compiled)
    return _per_row(model, rows)


def _ragged(model, rows: list[RowInput], compiled: CompiledBlocks | None) -> mx.array:
    inner = model.model
    plan = BatchPlan(rows)
    batched = {id(r) for r in plan.rows}
    # The batch's rows go first so their tokens are one slice of the flat sequence.
    order = plan.rows + [r for r in rows if id(r) not in batched]
    tokens = join_rows([r.tokens for r in order])  # last step's tokens in order: that array itself
    h = inner.embed_tokens(tokens)  # (T, D): one flat sequence of every row's new tokens
    spans, start = {}, 0
    for r in order:
        spans[id(r)] = (start, r.n)
        start += r.n
    # Each token's position in its own sequence, for one RoPE call over all rows. int32:
    # mx.fast.rope casts offsets of any other dtype (numpy's default int64) on every call.
    positions = mx.array(np.concatenate([np.arange(r.kv.offset, r.kv.offset + r.n, dtype=np.int32)
                                         for r in order]))
    others = order[len(plan.rows):]  # prompt chunks on their own caches
    layers = inner.layers
    seams = compiled.seams(layers) if compiled is not None and start <= COMPILE_MAX_TOKENS else None
    if seams is None:
        x = None
        for li, layer in enumerate(layers):
            q, kv = _project(layer, h, positions, x)
            after = layers[li + 1].input_layernorm if li + 1 < len(layers) else None
            h, x = _finish(layer, h, _attend(layer.self_attn, q, kv, plan, others, spans, li), after)
    else:
        q, kv = seams[0](h, positions)
        for li, layer in enumerate(layers):
            o = _attend(layer.self_attn, q, kv, plan, others, spans, li)
            if li + 1 < len(layers):
                h, q, kv = seams[li + 1](h, o, positions)
            else:
                h = seams[-1](h, o)
    plan.advance()
    last = [i for r in rows if r.sample
            for i in range(spans[id(r)][0] + r.n - r.logits, spans[id(r)][0] + r.n)]
    if not last:
        return mx.zeros((0, 0))
    h = inner.norm(h[mx.array(last)] if len(last) < start or last != list(range(start)) else h)
    return _lm_head(model, h)


def _project(layer, h: mx.array, positions: mx.array, x: mx.array | None = None) -> tuple[mx.array, mx.array]:
    """The layer's input norm of the residual stream h (x: already computed by the last layer's
    `_finish`), then its q/k/v projections, q/k norms and RoPE for every token of the pass:
    q (T, heads, 1, dim) and kv (2T, kv_heads, 1, dim), the T keys then the T values, which
    the decode batch stores with one scatter (kv.py)."""
    attn = layer.self_attn
    x = layer.input_layernorm(h) if x is None else x
    total = x.shape[0]
    prep = _fused(attn, "head_prep", x)
    limit = JOINED_MAX_TOKENS["fused_qkv"] if prep is not None else min(JOINED_MAX_TOKENS["fused_qkv"],
                                                                         UNFUSED_QKV_MAX_TOKENS)
    if "fused_qkv" in attn and total <= limit:  # one matmul for q, k and v (fuse.py)
        qkv = attn.fused_qkv(x)
        cuts = split_sizes(attn, "fused_qkv")
        if prep is not None:  # norms and RoPE read q, k and v in place, in one kernel (headprep.py)
            return prep(qkv, qkv, qkv, (0, *cuts), *_norm_weights(attn), positions)
        q, k, v = mx.split(qkv, cuts, axis=-1)
    else:
        q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        if prep is not None:
            return prep(q, k, v, (0, 0, 0), *_norm_weights(attn), positions)
    q = q.reshape(total, attn.n_heads, -1)
    k = k.reshape(total, attn.n_kv_heads, -1)
    v = v.reshape(total, attn.n_kv_heads, -1)
    if getattr(attn, "q_norm", None) is not None:
        q, k = attn.q_norm(q), attn.k_norm(k)
    # RoPE with one batch entry per token, each at its own offset.
    q = attn.rope(q[:, :, None, :], offset=positions)
    k = attn.rope(k[:, :, None, :], offset=positions)
    return q, mx.concatenate([k, v[:, :, None, :]])


def _fused(module, name: str, x: mx.array):
    """The fused kernel attached to `module` as `name` (kernels/fused.py), or None: none
    attached, MLX's ops asked for, or x not in the dtype it verified in."""
    kernel = getattr(module, name, None)
    if kernel is None or bypassed() or not fused_active() or x.dtype != kernel.dtype:
        return None
    return kernel


def _add_norm(norm, h: mx.array, delta: mx.array) -> tuple[mx.array, mx.array]:
    """h + delta and its norm: one kernel where attached (kernels/addnorm.py)."""
    kernel = _fused(norm, "add_norm", h)
    if kernel is not None:
        return kernel(h, delta, norm.weight)
    h = h + delta
    return h, norm(h)


def _norm_weights(attn) -> tuple[mx.array | None, mx.array | None]:
    if getattr(attn, "q_norm", None) is None:
        return None, None
    return attn.q_norm.weight, attn.k_norm.weight


def _finish(layer, h: mx.array, o: mx.array, after=None) -> tuple[mx.array, mx.array | None]:
    """The attention output projection and residual, then the MLP block and residual: the
    residual stream after the layer and, given `after` (the next layer's input norm), its
    norm (None without); o (T, heads, 1, dim)."""
    h, x = _linear_add_norm(layer.self_attn.o_proj, layer.post_attention_layernorm, o.reshape(o.shape[0], -1), h)
    mlp = layer.mlp
    if "fused_gate_up" in mlp and x.shape[0] <= JOINED_MAX_TOKENS["fused_gate_up"]:  # one matmul (fuse.py)
        gated = getattr(mlp.fused_gate_up, "gated", None)  # silu(gate) * up in its kernel (kernels/glu.py)
        act = gated(x) if gated is not None else None
        if act is not None:
            return _linear_add_norm(mlp.down_proj, after, act, h)
        gate_up = mlp.fused_gate_up(x)
        folded = getattr(mlp.down_proj, "glu", None)  # activation inside down_proj's kernel (kernels/glu.py)
        out = folded(gate_up) if folded is not None else None
        if out is None:
            gate, up = mx.split(gate_up, 2, axis=-1)
            return _linear_add_norm(mlp.down_proj, after, swiglu(gate, up), h)
    else:
        out = mlp(x)
    return _add_norm(after, h, out) if after is not None else (h + out, None)


def _linear_add_norm(linear, norm, x: mx.array, h: mx.array) -> tuple[mx.array, mx.array | None]:
    """h + linear(x) and its norm (None without a norm): one kernel where the linear's tuned
    kernel verified the add and norm (kernels/normfold.py), otherwise the linear and `_add_norm`."""
    if norm is None:
        return h + linear(x), None
    fold = getattr(linear, "add_norm", None) if fused_active() else None
    folded = fold(x, h, norm) if fold is not None else None
    return folded if folded is not None else _add_norm(norm, h, linear(x))


def _attend(attn, q: mx.array, kv: mx.array, plan: BatchPlan, others: list[RowInput], spans,
            li: int) -> mx.array:
    """Each row's queries against its own KV (writing the new keys/values first): (T, heads, 1, dim).
    kv (2T, kv_heads, 1, dim): the pass's keys, then its values."""
    outs = []
    b, total = plan.tokens, q.shape[0]
    kernel = attention_kernel(attn, q) if fused_active() and not bypassed() else None
    if b == total:  # only the batch's rows: no slicing
        return plan.attend(li, q, kv, attn.scale, kernel)
    if b:
        outs.append(plan.attend(li, q[:b], mx.concatenate([kv[:b], kv[total : total + b]]), attn.scale, kernel))
    for row in others:
        s, n = spans[id(row)]
        outs.append(_row_attention(row.kv, li, q[s : s + n], kv[s : s + n], kv[total + s : total + s + n],
                                   attn.scale))
    return mx.concatenate(outs) if len(outs) > 1 else outs[0]


def _row_attention(kv: RowKV, li: int, q: mx.array, k: mx.array, v: mx.array, scale: float) -> mx.array:
    """One row's n new tokens (a prompt chunk) against its own caches.
    q/k/v (n, heads, 1, dim) in, (n, heads, 1, dim) out."""
    n = q.shape[0]
    k, v = k.transpose(2, 1, 0, 3), v.transpose(2, 1, 0, 3)
    keys, values = kv.layers[li].update_and_fetch(k, v)
    # "causal" aligns the queries to the end of the keys, i.e. after the cached prefix.
    o = mx.fast.scaled_dot_product_attention(
        q.transpose(2, 1, 0, 3), keys, values, scale=scale, mask="causal" if n > 1 else None,
    )
    return o.transpose(2, 1, 0, 3)


def _lm_head(model, h: mx.array) -> mx.array:
    if getattr(model.args, "tie_word_embeddings", False) or not hasattr(model, "lm_head"):
        return model.model.embed_tokens.as_linear(h)
    return model.lm_head(h)


def _per_row(model, rows: list[RowInput]) -> mx.array:
    logits = []
    for r in rows:
        out = model(r.tokens[None], cache=r.kv.layers)
        if r.sample:
            logits.append(out[0, -r.logits:])
    return mx.concatenate(logits) if logits else mx.zeros((0, 0))


# Passes of at most this many tokens (decode steps, short forced or draft chunks) run each
# layer's projection and MLP halves as compiled graphs: a decode step of a 4B model on an
# H200 is host-bound at B = 8 (a native profile found the engine thread busy through the
# whole step: ~70% queuing ops inside MLX's eval, ~24% building the graph in Python), and
# compiling removes the Python work of building ~20 ops per layer. Longer passes (prompt
# chunks) are compute-bound and would each compile a new shape.
COMPILE_MAX_TOKENS = 64


class CompiledBlocks:
    """The compiled graphs between one model's attention calls, owned by the engine that runs it.

    `seams(layers)` is [project 0, finish 0 + project 1, …, finish L-1]: one compiled call
    per layer boundary instead of two (a call costs ~20 µs of host time on a 2-core x86 VM). A
    compiled graph captures the modules as they were when traced, so the lists are keyed
    by the registry's swap count (tuned-kernel patching and attaching fused kernels bump
    it), whether tuned kernels are bypassed, whether fused kernels are on (kernels/fused.py),
    whether folded activations are (registry.ungated) and `JOINED_MAX_TOKENS`; each distinct
    token count is traced once per key. The owner drops it (and collects) before MLX shuts
    down: compiled graphs freed during interpreter exit may abort the process.
    """

    def __init__(self):
        self._seams: dict[tuple, list] = {}

    def seams(self, layers: list) -> list:
        key = (id(layers), swap_count(), bypassed(), fused_active(), gated_active(),
               tuple(JOINED_MAX_TOKENS.values()))
        fns = self._seams.get(key)
        if fns is None:
            # Graphs of modules swapped out since are never used again: drop them.
            self._seams = {k: v for k, v in self._seams.items() if k[1] == key[1]}
            fns = self._seams[key] = _compile_seams(layers)
        return fns


def _compile_seams(layers: list) -> list:
    """Compiled (not yet traced) functions for each boundary between attention calls."""
    def first(h, positions):
        return _project(layers[0], h, positions)

    def between(before, after):
        def seam(h, o, positions):
            h, x = _finish(before, h, o, after.input_layernorm)
            return (h, *_project(after, h, positions, x))
        return seam

    def last(h, o):
        return _finish(layers[-1], h, o)[0]

    inner = [between(a, b) for a, b in zip(layers[:-1], layers[1:])]
    return [mx.compile(f) for f in (first, *inner, last)]
