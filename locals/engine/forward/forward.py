"""One forward pass over a ragged batch: each row brings its own new tokens and its own KV.

For llama/qwen-family models the rows' tokens are concatenated into one sequence, so
projections and MLP read the weights once for all rows. Rows in the shared `DecodeBatch`
(decoding one token, or several: forced tokens, drafts) attend in one call per layer
(batch_plan.py); prompt chunks attend per row over their own caches. Other architectures
fall back to one mlx-lm model call per row.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from locals.engine.forward.batch_plan import BatchPlan
from locals.engine.forward.choices import ForwardChoices
from locals.engine.forward.chunk_attention import chunk_attention
from locals.engine.forward.compiled import CompiledBlocks, padded_length, step_attention
from locals.engine.forward.kv import RowKV
from locals.engine.forward.layer_pass import DEFAULT, finish, lm_head, project
from locals.engine.kernels.decode_attention import active_for as attention_kernel
from locals.engine.forward.rowfeed import RowOf, join_rows

RAGGED_TYPES = {"llama", "mistral", "qwen2", "qwen3"}


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


def forward(model, rows: list[RowInput], compiled: CompiledBlocks | None = None,
            choices: ForwardChoices = DEFAULT) -> mx.array:
    """Logits (S, vocab) for the rows with `sample` set, in row order (`logits` rows each).
    With `compiled` (the engine's), short passes run each layer's halves as compiled graphs;
    `choices` says which kernels and graphs a pass may use (the engine's config)."""
    if supports_ragged(model):
        return _ragged(model, rows, compiled, choices)
    return _per_row(model, rows)


def _ragged(model, rows: list[RowInput], compiled: CompiledBlocks | None, choices: ForwardChoices) -> mx.array:
    inner = model.model
    plan = BatchPlan(rows)
    if compiled is not None and _whole_step_fits(plan, rows, choices):
        logits = _whole_step(model, rows, plan, compiled, choices)
        if logits is not None:
            return logits
    # Short passes run as compiled seams, padded so that the seams meet few lengths.
    total = sum(r.n for r in rows)
    short = compiled is not None and 0 < total <= choices.compile_max_tokens
    rows = _padded(rows, total, len(model.model.layers)) if short else rows
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
    seams = compiled.seams(layers, choices, start) if short else None
    if seams is None:
        x = None
        for li, layer in enumerate(layers):
            q, kv = project(layer, h, positions, x, choices=choices)
            after = layers[li + 1].input_layernorm if li + 1 < len(layers) else None
            o = _attend(layer.self_attn, q, kv, plan, others, spans, li, choices)
            h, x = finish(layer, h, o, after, choices)
    else:
        q, kv = seams[0](h, positions)
        for li, layer in enumerate(layers):
            o = _attend(layer.self_attn, q, kv, plan, others, spans, li, choices)
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
    return lm_head(model, h)


def _padded(rows: list[RowInput], total: int, n_layers: int) -> list[RowInput]:
    """The pass (`total` tokens) filled to its `padded_length` by a throwaway row on caches of its
    own (never sampled), so the compiled seams meet few lengths (docs/arch/engine.md, "Shapes")."""
    pad = padded_length(total) - total
    return rows + [RowInput(mx.zeros((pad,), mx.int32), pad, RowKV(n_layers), False)] if pad else rows


def _whole_step_fits(plan: BatchPlan, rows: list[RowInput], choices: ForwardChoices) -> bool:
    """Whether the pass is a pure decode step: every row in the decode batch, one token each,
    each sampled once."""
    return (choices.whole_steps and bool(plan.rows) and len(plan.rows) == len(rows) and plan.width == 1
            and len(rows) <= choices.compile_max_tokens and all(r.sample and r.logits == 1 for r in rows))


def _whole_step(model, rows: list[RowInput], plan: BatchPlan, compiled: CompiledBlocks,
                choices: ForwardChoices) -> mx.array | None:
    """The step as one compiled call (compiled.py): logits (B, vocab) in `rows`' order; None
    (nothing done) when its shape is not compiled yet and the engine compiles ahead."""
    batch = plan.batch
    # Few row counts, so the compiled step meets few shapes (docs/arch/engine.md, "Shapes").
    rows_in_step = step_rows(len(plan.rows), batch.rows_cap)
    inputs = plan.padded_step(rows_in_step)
    if inputs is None:  # members waiting out this step hold the free slots: this step's exact count
        rows_in_step, inputs = len(plan.rows), plan.padded_step(len(plan.rows))
    graph = compiled.step(model, step_attention(model, plan, choices), (rows_in_step, batch.rows_cap, batch.t_cap),
                          choices)
    if graph is None:
        return None
    tokens = join_rows([r.tokens for r in plan.rows])  # last step's tokens in order: that array itself
    if rows_in_step > len(plan.rows):
        tokens = mx.concatenate([tokens, mx.zeros((rows_in_step - len(plan.rows),), tokens.dtype)])
    positions, index, meta = inputs  # each row's one new token sits at its length
    logits, *kvs = graph(tokens, positions, index, meta, *batch.kv)
    batch.kv[:] = kvs  # written in place: by the head kernel, or by the scatter (the old arrays are only inputs)
    plan.advance()
    at = {id(r): i for i, r in enumerate(plan.rows)}
    order = [at[id(r)] for r in rows]
    return logits if order == list(range(rows_in_step)) else logits[mx.array(order)]


def step_rows(rows: int, slots: int) -> int:
    """Rows a compiled decode step runs for `rows` decoding rows in a batch of `slots`: one row
    alone, else every slot (a few more rows cost a decode step little; each count is a graph)."""
    return 1 if rows == 1 else slots


def _attend(attn, q: mx.array, kv: mx.array, plan: BatchPlan, others: list[RowInput], spans,
            li: int, choices: ForwardChoices) -> mx.array:
    """Each row's queries against its own KV (writing the new keys/values first): (T, heads * dim).
    kv (2T, kv_heads, 1, dim): the pass's keys, then its values."""
    outs = []
    b, total = plan.tokens, q.shape[0]
    kernel = attention_kernel(attn, q) if choices.fused and choices.decode_attention else None
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
    q/k/v (n, heads, 1, dim) in, (n, heads * dim) out."""
    n = q.shape[0]
    k, v = k.transpose(2, 1, 0, 3), v.transpose(2, 1, 0, 3)
    cache = kv.layers[li]
    keys, values = cache.update_and_fetch(k, v)
    # Causal with the queries aligned to the end of the keys, i.e. after the cached prefix.
    o = chunk_attention(q.transpose(2, 1, 0, 3), keys, values, scale, buffers=(cache.keys, cache.values))
    return o.transpose(2, 1, 0, 3).reshape(n, -1)


def _per_row(model, rows: list[RowInput]) -> mx.array:
    logits = []
    for r in rows:
        out = model(r.tokens[None], cache=r.kv.layers)
        if r.sample:
            logits.append(out[0, -r.logits:])
    return mx.concatenate(logits) if logits else mx.zeros((0, 0))
