"""One forward pass over a ragged batch: each row brings its own new tokens and its own KV.

For llama/qwen-family models the rows' tokens are concatenated into one sequence, so
projections and MLP read the weights once for all rows. Rows decoding one token attend in
one call per layer over the shared `DecodeBatch`; prompt chunks and forced-token chunks
attend per row. Other architectures fall back to one mlx-lm model call per row.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from locals.engine.kernels.registry import bypassed
from locals.engine.kv import RowKV
from locals.engine.rowfeed import RowOf, join_rows

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


def forward(model, rows: list[RowInput], compiled: CompiledBlocks | None = None) -> mx.array:
    """Logits (S, vocab) for the rows with `sample` set, in row order (`logits` rows each).
    With `compiled` (the engine's), short passes run each layer's halves as compiled graphs."""
    if supports_ragged(model):
        return _ragged(model, rows, compiled)
    return _per_row(model, rows)


class _DecodePlan:
    """The rows that feed one token from a `DecodeBatch` slot this pass, and their indices.

    Built once per pass (joining rows that just finished their prompt), shared by all layers.
    """

    def __init__(self, rows: list[RowInput]):
        candidates = [r for r in rows if r.n == 1 and r.kv.batch is not None]
        batch = candidates[0].kv.batch if candidates else None
        self.rows: list[RowInput] = []
        self.batch = batch
        if batch is None:
            return
        for r in candidates:
            # A row with no KV yet (a one-token prompt) reads it alone first and joins later;
            # so does one too long for the batch's padding (it keeps its own caches).
            if not r.kv.resident and r.kv.offset > 0 and batch.fits(r.kv.offset):
                batch.join(r.kv)
        self.rows = sorted((r for r in candidates if r.kv.resident), key=lambda r: r.kv.slot)
        if not self.rows:
            return
        lengths = [r.kv.length for r in self.rows]
        slots = [r.kv.slot for r in self.rows]
        self.t = max(lengths) + 1
        batch.reserve(len(batch.members), self.t)
        # Every member decoding, in slot order (the usual case): plain slices, no gather.
        self.slots = None if slots == list(range(len(batch.members))) else mx.array(slots)
        # Index and mask are shaped on the host: constants add no ops to the step's graph.
        at = np.asarray(lengths, dtype=np.int32)
        heads = np.arange(batch.keys[0].shape[1], dtype=np.int32)[None, :, None]
        self.index = (mx.array(np.asarray(slots, dtype=np.int32)[:, None, None]), mx.array(heads),
                      mx.array(at[:, None, None]))
        # Positions past each row's new token are padding; no mask when all lengths agree.
        self.mask = None if len(set(lengths)) == 1 else (
            mx.array((np.arange(self.t)[None] <= at[:, None])[:, None, None, :]))

    def attend(self, li: int, q: mx.array, k: mx.array, v: mx.array, scale: float) -> mx.array:
        """q (B, heads, dim), k/v (B, kv_heads, dim) of the plan's rows -> (B, heads * dim)."""
        self.batch.write(li, self.index, k[:, :, None, :], v[:, :, None, :])
        keys, values = self.batch.view(li, self.t, self.slots)
        o = mx.fast.scaled_dot_product_attention(q[:, :, None, :], keys, values, scale=scale, mask=self.mask)
        return o.reshape(q.shape[0], -1)

    def advance(self) -> None:
        for r in self.rows:
            r.kv.length += 1


def _ragged(model, rows: list[RowInput], compiled: CompiledBlocks | None) -> mx.array:
    inner = model.model
    plan = _DecodePlan(rows)
    batched = {id(r) for r in plan.rows}
    # The batched decode rows go first so their tokens are one slice of the flat sequence.
    order = plan.rows + [r for r in rows if id(r) not in batched]
    tokens = join_rows([r.tokens for r in order])  # last step's tokens in order: that array itself
    h = inner.embed_tokens(tokens)  # (T, D): one flat sequence of every row's new tokens
    spans, start = {}, 0
    for r in order:
        spans[id(r)] = (start, r.n)
        start += r.n
    # Each token's position in its own sequence, for one RoPE call over all rows.
    positions = mx.array(np.concatenate([np.arange(r.kv.offset, r.kv.offset + r.n) for r in order]))
    others = order[len(plan.rows):]
    for r in others:
        if r.kv.resident:  # forced tokens of a decoding row: room for the whole chunk
            r.kv.batch.reserve(len(r.kv.batch.members), r.kv.length + r.n)
    blocks = compiled if start <= COMPILE_MAX_TOKENS else None
    for li, layer in enumerate(inner.layers):
        attn = layer.self_attn
        if blocks is None:
            q, k, v = _project(layer, h, positions)
        else:
            q, k, v = blocks.project(li, layer)(h, positions)
        o = _attend(attn, q, k, v, plan, others, spans, li)
        h = _finish(layer, h, o) if blocks is None else blocks.finish(li, layer)(h, o)
    plan.advance()
    for r in others:
        if r.kv.resident:
            r.kv.length += r.n
    last = [i for r in rows if r.sample
            for i in range(spans[id(r)][0] + r.n - r.logits, spans[id(r)][0] + r.n)]
    if not last:
        return mx.zeros((0, 0))
    h = inner.norm(h[mx.array(last)] if len(last) < start or last != list(range(start)) else h)
    return _lm_head(model, h)


def _project(layer, h: mx.array, positions: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """The layer's input norm, q/k/v projections, q/k norms and RoPE for every token of the pass."""
    attn = layer.self_attn
    x = layer.input_layernorm(h)
    total = x.shape[0]
    q = attn.q_proj(x).reshape(total, attn.n_heads, -1)
    k = attn.k_proj(x).reshape(total, attn.n_kv_heads, -1)
    v = attn.v_proj(x).reshape(total, attn.n_kv_heads, -1)
    if getattr(attn, "q_norm", None) is not None:
        q, k = attn.q_norm(q), attn.k_norm(k)
    # RoPE with one batch entry per token, each at its own offset.
    q = attn.rope(q[:, :, None, :], offset=positions)[:, :, 0, :]
    k = attn.rope(k[:, :, None, :], offset=positions)[:, :, 0, :]
    return q, k, v


def _finish(layer, h: mx.array, o: mx.array) -> mx.array:
    """The attention output projection and residual, then the MLP block and its residual."""
    h = h + layer.self_attn.o_proj(o)
    return h + layer.mlp(layer.post_attention_layernorm(h))


def _attend(attn, q: mx.array, k: mx.array, v: mx.array, plan: _DecodePlan, others: list[RowInput], spans,
            li: int) -> mx.array:
    """Each row's queries against its own KV (writing the new keys/values first): (T, heads * dim)."""
    outs = []
    b = len(plan.rows)
    if b:
        outs.append(plan.attend(li, q[:b], k[:b], v[:b], attn.scale))
    for row in others:
        s, n = spans[id(row)]
        outs.append(_row_attention(row.kv, li, q[s : s + n], k[s : s + n], v[s : s + n], attn.scale))
    return mx.concatenate(outs) if len(outs) > 1 else outs[0]


def _row_attention(kv: RowKV, li: int, q: mx.array, k: mx.array, v: mx.array, scale: float) -> mx.array:
    """One row's n new tokens against its own KV: a prompt chunk, or forced tokens of a decoding row."""
    n = q.shape[0]
    k, v = k.transpose(1, 0, 2)[None], v.transpose(1, 0, 2)[None]
    if kv.resident:
        kv.batch.write_chunk(li, kv.slot, kv.length, k, v)
        keys, values = kv.batch.row_kv(li, kv.slot, kv.length + n)
    else:
        keys, values = kv.layers[li].update_and_fetch(k, v)
    # "causal" aligns the queries to the end of the keys, i.e. after the cached prefix.
    o = mx.fast.scaled_dot_product_attention(
        q.transpose(1, 0, 2)[None], keys, values, scale=scale, mask="causal" if n > 1 else None,
    )
    return o[0].transpose(1, 0, 2).reshape(n, -1)


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
    """Per-layer compiled `_project` / `_finish` of one model, owned by the engine that runs it.

    A compiled graph captures the layer's modules as they were when traced, so the key
    holds the modules' identities (tuned-kernel patching swaps them) and whether tuned
    kernels are bypassed; each distinct token count is traced once per key. The owner drops
    it (and collects) before MLX shuts down: compiled graphs freed during interpreter exit
    may abort the process.
    """

    def __init__(self):
        self._fns: dict[tuple, object] = {}

    def project(self, li: int, layer):
        attn = layer.self_attn
        key = ("p", li, id(attn.q_proj), id(attn.k_proj), id(attn.v_proj), bypassed())
        fn = self._fns.get(key)
        if fn is None:
            fn = self._fns[key] = mx.compile(lambda h, positions: _project(layer, h, positions))
        return fn

    def finish(self, li: int, layer):
        mlp = layer.mlp
        key = ("f", li, id(layer.self_attn.o_proj), *(id(m) for m in mlp.children().values()), bypassed())
        fn = self._fns.get(key)
        if fn is None:
            fn = self._fns[key] = mx.compile(lambda h, o: _finish(layer, h, o))
        return fn
