"""One forward pass over a ragged batch: each row brings its own new tokens and its own KV.

For llama/qwen-family models the rows' tokens are concatenated into one sequence, so
projections and MLP read the weights once for all rows, and attention runs per row
against that row's cache (no padding, prefill chunks and decode tokens in one pass).
Other architectures fall back to one mlx-lm model call per row.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from locals.engine.kv import RowKV

RAGGED_TYPES = {"llama", "mistral", "qwen2", "qwen3"}


@dataclass
class RowInput:
    """A row's new tokens for this pass; `sample` asks for the logits after its last token."""

    tokens: mx.array  # (n,) int32, may be lazy (last step's sampled token)
    n: int
    kv: RowKV
    sample: bool


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


def forward(model, rows: list[RowInput]) -> mx.array:
    """Logits (S, vocab) for the rows with `sample` set, in row order."""
    if supports_ragged(model):
        return _ragged(model, rows)
    return _per_row(model, rows)


def _ragged(model, rows: list[RowInput]) -> mx.array:
    inner = model.model
    tokens = mx.concatenate([r.tokens for r in rows]) if len(rows) > 1 else rows[0].tokens
    h = inner.embed_tokens(tokens)  # (T, D): one flat sequence of every row's new tokens
    spans, start = [], 0
    for r in rows:
        spans.append((start, r.n))
        start += r.n
    # Each token's position in its own sequence, for one RoPE call over all rows.
    positions = mx.array(np.concatenate([np.arange(r.kv.offset, r.kv.offset + r.n) for r in rows]))
    for li, layer in enumerate(inner.layers):
        h = h + _attention(layer.self_attn, layer.input_layernorm(h), rows, spans, positions, li)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    last = [s + n - 1 for (s, n), r in zip(spans, rows) if r.sample]
    if not last:
        return mx.zeros((0, 0))
    h = inner.norm(h[mx.array(last)] if len(last) < start else h)
    return _lm_head(model, h)


def _attention(attn, x: mx.array, rows: list[RowInput], spans, positions: mx.array, layer_index: int) -> mx.array:
    total = x.shape[0]
    q = attn.q_proj(x).reshape(total, attn.n_heads, -1)
    k = attn.k_proj(x).reshape(total, attn.n_kv_heads, -1)
    v = attn.v_proj(x).reshape(total, attn.n_kv_heads, -1)
    if getattr(attn, "q_norm", None) is not None:
        q, k = attn.q_norm(q), attn.k_norm(k)
    # RoPE with one batch entry per token, each at its own offset.
    q = attn.rope(q[:, :, None, :], offset=positions)[:, :, 0, :]
    k = attn.rope(k[:, :, None, :], offset=positions)[:, :, 0, :]
    outs = []
    for (s, n), row in zip(spans, rows):
        cache = row.kv.layers[layer_index]
        keys, values = cache.update_and_fetch(
            k[s : s + n].transpose(1, 0, 2)[None], v[s : s + n].transpose(1, 0, 2)[None]
        )
        # "causal" aligns the queries to the end of the keys, i.e. after the cached prefix.
        o = mx.fast.scaled_dot_product_attention(
            q[s : s + n].transpose(1, 0, 2)[None], keys, values, scale=attn.scale,
            mask="causal" if n > 1 else None,
        )
        outs.append(o[0].transpose(1, 0, 2).reshape(n, -1))
    o = mx.concatenate(outs) if len(outs) > 1 else outs[0]
    return attn.o_proj(o)


def _lm_head(model, h: mx.array) -> mx.array:
    if getattr(model.args, "tie_word_embeddings", False) or not hasattr(model, "lm_head"):
        return model.model.embed_tokens.as_linear(h)
    return model.lm_head(h)


def _per_row(model, rows: list[RowInput]) -> mx.array:
    logits = []
    for r in rows:
        out = model(r.tokens[None], cache=r.kv.layers)
        if r.sample:
            logits.append(out[0, -1])
    return mx.stack(logits) if logits else mx.zeros((0, 0))
