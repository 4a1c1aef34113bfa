"""Applying stacked constraint bitmasks to a batch of logits on the device, in one step.

The engine stacks the constrained rows' `mask()` results into a (B, W) uint32 array;
bit i of word i // 32 allows token i. Rows without a constraint are best left out of the
call (gather the constrained rows, apply, scatter back) so that they pay nothing.
"""

from __future__ import annotations

from functools import lru_cache

import mlx.core as mx


@lru_cache(maxsize=8)
def _positions(width: int) -> tuple[mx.array, mx.array]:
    ids = mx.arange(width, dtype=mx.uint32)
    return ids >> 5, ids & 31


def apply_bitmasks(logits: mx.array, masks: mx.array) -> mx.array:
    """`logits` (B, V) with every token outside its row's bitmask `masks` (B, W) set to -inf."""
    words, shifts = _positions(logits.shape[-1])
    bits = (mx.take(masks, words, axis=1) >> shifts) & 1
    return mx.where(bits.astype(mx.bool_), logits, mx.array(-float("inf"), dtype=logits.dtype))
