"""The fused kernels a model's layers get on a GPU, once verified there: q/k norm + RoPE
(headprep.py), residual add + norm (addnorm.py) and decode attention (decode_attention.py); and a
switch that runs MLX's ops instead."""

from __future__ import annotations

from contextlib import AbstractContextManager

import mlx.nn as nn

from locals.engine.kernels import addnorm, decode_attention, headprep
from locals.engine.kernels.switch import Switch

_fused = Switch()  # off while mlx_ops() is active


def mlx_ops() -> AbstractContextManager[None]:
    """While active, layers run MLX's ops where a fused kernel is attached (benchmarks compare
    the two on one engine; not for concurrent serving)."""
    return _fused.off()


def active() -> bool:
    """False while `mlx_ops()` is active (compiled graphs are kept apart by it)."""
    return _fused.on


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
