"""Applying stacked constraint bitmasks to a batch of logits on the device, in one step.

The engine stacks the constrained rows' `mask()` results into a (B, W) uint32 array;
bit i of word i // 32 allows token i. The sampler (rows/sampling.py) fills unconstrained
rows with all-ones words; this is the one place the bits meet the logits.
"""

from __future__ import annotations

import mlx.core as mx


def apply_bitmasks(logits: mx.array, masks: mx.array) -> mx.array:
    """`logits` (B, V) with every token outside its row's bitmask `masks` (B, W >= V / 32) set
    to -inf. The words are unpacked by broadcast shifts (no gather of a word per token)."""
    rows, vocab = logits.shape
    shifts = mx.arange(32, dtype=mx.uint32)
    bits = ((masks[:, :, None] >> shifts) & 1).reshape(rows, -1)[:, :vocab]
    return mx.where(bits.astype(mx.bool_), logits, mx.array(-float("inf"), dtype=logits.dtype))
