"""The pieces of one layer's pass over a flat sequence of tokens, shared by the eager and compiled paths.

`project` (input norm, q/k/v, their norms and RoPE) and `finish` (output projection, MLP and
residuals) run the tuned and fused kernels where attached and MLX's ops otherwise; `lm_head` the
model's head. Attention itself lives with its callers (forward.py, compiled.py).
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.activations import swiglu

from locals.engine.forward.choices import ForwardChoices
from locals.engine.forward.fuse import split_sizes

DEFAULT = ForwardChoices()


def _unfused_qkv_limit() -> int:
    """Up to how many tokens a pass joins q/k/v where the fused q/k kernel is not in use.

    CUDA: 4. There MLX's rms_norm copies the strided q/k slices of a joined output of several
    rows, and RoPE copies strided 4-D inputs: without the fused kernel, joined lost to the parts
    at B = 8 and won at B = 4 (docs/benchmarks-log.md, "Joined q/k/v and gate/up matmuls").
    Elsewhere every pass: nothing has measured otherwise there (the CPU's dense path runs the
    same either way)."""
    cuda = getattr(mx, "cuda", None)
    return 4 if cuda is not None and cuda.is_available() else 1 << 30


UNFUSED_QKV_MAX_TOKENS = _unfused_qkv_limit()


def project(layer, h: mx.array, positions: mx.array, x: mx.array | None = None,
            into: tuple[mx.array, mx.array] | None = None,
            choices: ForwardChoices = DEFAULT) -> tuple[mx.array, mx.array | None]:
    """The layer's input norm of the residual stream h (x: already computed by the last layer's
    `finish`), then its q/k/v projections, q/k norms and RoPE for every token of the pass:
    q (T, heads, 1, dim) and kv (2T, kv_heads, 1, dim), the T keys then the T values, which
    the decode batch stores with one scatter (kv.py). Given `into` (the decode batch's shared
    K/V array and each token's slot), the fused kernel writes them there itself where it
    verified that (headprep.py `into_cache`) and `choices` allow it, and kv is None."""
    attn = layer.self_attn
    x = layer.input_layernorm(h) if x is None else x
    total = x.shape[0]
    prep = _fused(attn, "head_prep", x, choices)
    limit = choices.joined_qkv_max_tokens
    if prep is None:
        limit = min(limit, UNFUSED_QKV_MAX_TOKENS)
    if "fused_qkv" in attn and total <= limit:  # one matmul for q, k and v (fuse.py)
        qkv = attn.fused_qkv(x)
        cuts = split_sizes(attn, "fused_qkv")
        if prep is not None:  # norms and RoPE read q, k and v in place, in one kernel (headprep.py)
            return _prepare(prep, attn, (qkv, qkv, qkv, (0, *cuts)), positions, into, choices)
        q, k, v = mx.split(qkv, cuts, axis=-1)
    else:
        q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        if prep is not None:
            return _prepare(prep, attn, (q, k, v, (0, 0, 0)), positions, into, choices)
    q = q.reshape(total, attn.n_heads, -1)
    k = k.reshape(total, attn.n_kv_heads, -1)
    v = v.reshape(total, attn.n_kv_heads, -1)
    if getattr(attn, "q_norm", None) is not None:
        q, k = attn.q_norm(q), attn.k_norm(k)
    # RoPE with one batch entry per token, each at its own offset.
    q = attn.rope(q[:, :, None, :], offset=positions)
    k = attn.rope(k[:, :, None, :], offset=positions)
    return q, mx.concatenate([k, v[:, :, None, :]])


def _prepare(prep, attn, sources: tuple, positions: mx.array, into,
             choices: ForwardChoices) -> tuple[mx.array, mx.array | None]:
    """The fused q/k kernel on q/k/v `sources` (three arrays and their column offsets)."""
    if into is not None and choices.cache_writes and prep.writes_cache():
        return prep.into_cache(*sources, *_norm_weights(attn), positions, *into), None
    return prep(*sources, *_norm_weights(attn), positions)


def _fused(module, name: str, x: mx.array, choices: ForwardChoices):
    """The fused kernel attached to `module` as `name` (kernels/fused.py), or None: none
    attached, MLX's ops chosen, or x not in the dtype it verified in."""
    kernel = getattr(module, name, None)
    if kernel is None or not choices.fused or x.dtype != kernel.dtype:
        return None
    return kernel


def _add_norm(norm, h: mx.array, delta: mx.array, choices: ForwardChoices) -> tuple[mx.array, mx.array]:
    """h + delta and its norm: one kernel where attached (kernels/addnorm.py)."""
    kernel = _fused(norm, "add_norm", h, choices)
    if kernel is not None:
        return kernel(h, delta, norm.weight)
    h = h + delta
    return h, norm(h)


def _norm_weights(attn) -> tuple[mx.array | None, mx.array | None]:
    if getattr(attn, "q_norm", None) is None:
        return None, None
    return attn.q_norm.weight, attn.k_norm.weight


def finish(layer, h: mx.array, o: mx.array, after=None,
           choices: ForwardChoices = DEFAULT) -> tuple[mx.array, mx.array | None]:
    """The attention output projection and residual, then the MLP block and residual: the
    residual stream after the layer and, given `after` (the next layer's input norm), its
    norm (None without); o (T, heads * dim), attention's output as it comes."""
    h, x = _linear_add_norm(layer.self_attn.o_proj, layer.post_attention_layernorm, o, h, choices)
    mlp = layer.mlp
    if "fused_gate_up" in mlp and x.shape[0] <= choices.joined_gate_up_max_tokens:  # one matmul (fuse.py)
        # silu(gate) * up in the joined layer's kernel where it verified (kernels/glu.py)
        gated = getattr(mlp.fused_gate_up, "gated", None) if choices.gated else None
        act = gated(x) if gated is not None else None
        if act is None:
            gate, up = mx.split(mlp.fused_gate_up(x), 2, axis=-1)
            act = swiglu(gate, up)
        return _linear_add_norm(mlp.down_proj, after, act, h, choices)
    out = mlp(x)
    return _add_norm(after, h, out, choices) if after is not None else (h + out, None)


def _linear_add_norm(linear, norm, x: mx.array, h: mx.array,
                     choices: ForwardChoices) -> tuple[mx.array, mx.array | None]:
    """h + linear(x) and its norm (None without a norm): one kernel where the linear's tuned
    kernel verified the add and norm (kernels/normfold.py), otherwise the linear and `_add_norm`."""
    if norm is None:
        return h + linear(x), None
    fold = getattr(linear, "add_norm", None) if choices.fused else None
    folded = fold(x, h, norm) if fold is not None else None
    return folded if folded is not None else _add_norm(norm, h, linear(x), choices)


def lm_head(model, h: mx.array) -> mx.array:
    if getattr(model.args, "tie_word_embeddings", False) or not hasattr(model, "lm_head"):
        return model.model.embed_tokens.as_linear(h)
    return model.lm_head(h)
