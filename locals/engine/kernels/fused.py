"""The fused kernels a model's layers get on a GPU, once verified there: q/k norm + RoPE
(headprep.py), residual add + norm (addnorm.py) and decode attention (decode_attention.py).
Whether a pass uses them is the engine's choice (forward/choices.py)."""

from __future__ import annotations

import mlx.nn as nn

from locals.engine.kernels import addnorm, decode_attention, headprep


def attach(model: nn.Module, backend: str) -> dict[str, int]:
    """Attach every fused kernel that verifies on `backend` ("cuda", "metal"; nothing elsewhere):
    how many layers got each."""
    dtype = activation_dtype(model)
    return {"heads": headprep.attach(model, backend, dtype), "norms": addnorm.attach(model, backend, dtype),
            "attention": decode_attention.attach(model, backend, dtype)}


def activation_dtype(model: nn.Module):
    """The dtype the model computes in: its embedding's (its scales' when quantized)."""
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if embed is None:
        return None
    return embed["scales"].dtype if "scales" in embed else embed.weight.dtype
