"""Per-sequence KV storage: one mlx-lm `KVCache` per layer, growing in its own blocks.

Each sequence owns its caches, so memory follows its own length (no padding to the
batch's longest) and finishing a sequence frees its memory by dropping the object.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import KVCache

# A prefix's KV as stored by the prefix cache: per layer (keys, values), each
# (1, kv_heads, n_tokens, head_dim).
LayerKV = tuple[mx.array, mx.array]


class RowKV:
    """The KV of one sequence across all layers."""

    def __init__(self, n_layers: int):
        self.layers = [KVCache() for _ in range(n_layers)]

    @property
    def offset(self) -> int:
        return self.layers[0].offset

    def load(self, kv: list[LayerKV], n: int) -> None:
        """Start from the first `n` tokens of a stored prefix (copy-free slices)."""
        for cache, (keys, values) in zip(self.layers, kv):
            cache.state = (keys[..., :n, :], values[..., :n, :], n)

    def snapshot(self, n: int | None = None) -> list[LayerKV]:
        """The first `n` tokens (default: all) as per-layer arrays for the prefix cache.

        Copied, so the stored entry does not keep this row's whole growing buffer alive.
        """
        n = self.offset if n is None else n
        out = [(mx.contiguous(c.keys[..., :n, :]), mx.contiguous(c.values[..., :n, :])) for c in self.layers]
        mx.async_eval([a for pair in out for a in pair])
        return out

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.layers)


def kv_bytes_per_token(model) -> int:
    """Bytes of K and V one token takes across all layers, from the layers' k_proj widths."""
    total = 0
    for layer in model.layers:
        attn = getattr(layer, "self_attn", None)
        k_proj = getattr(attn, "k_proj", None)
        # k_proj's output width is kv_heads * head_dim (also for quantized weights).
        width = k_proj.weight.shape[0] if k_proj is not None else model.args.hidden_size
        total += 2 * width
    return total * kv_dtype_size(model)


def kv_dtype_size(model) -> int:
    """Bytes per KV element: activations follow the float type of the embedding (or its scales)."""
    embed = model.model.embed_tokens
    ref = getattr(embed, "scales", None)
    ref = ref if ref is not None else embed.weight
    return ref.dtype.size
