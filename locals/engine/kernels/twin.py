"""A model's twin on MLX's ops: the same weight arrays in a module tree of its own, every tuned
linear (and tuned head) a plain quantized one again, no fused kernel attached.

For what must run MLX's own ops beside an engine that patched the model in place: mlx-lm's
generator on the same weights (the peer in `locals bench` and benchmarks/), or a second engine
built with `tuned_kernels=False`. Only modules are copied; the arrays are shared, so a twin costs
no weight memory, and patching either tree later leaves the other as it is.
"""

from __future__ import annotations

import copy

import mlx.nn as nn

from locals.engine.kernels.registry import TunedQuantizedEmbedding, TunedQuantizedLinear

# What kernels/fused.py attaches to a layer's modules (headprep, addnorm, decode_attention).
FUSED_ATTRIBUTES = ("head_prep", "add_norm", "decode_attention")


def mlx_ops_twin(model: nn.Module) -> nn.Module:
    """A twin of `model` (see the module docstring)."""
    return _twin(model)


def _twin(value):
    if isinstance(value, (TunedQuantizedLinear, TunedQuantizedEmbedding)):
        return _untuned(value)
    if isinstance(value, nn.Module):
        twin = copy.copy(value)  # its own dict of children and its own attributes
        twin.__dict__["_no_grad"] = set(value.__dict__.get("_no_grad", ()))
        for name in FUSED_ATTRIBUTES:
            twin.__dict__.pop(name, None)
        for key, child in value.items():
            twin[key] = _twin(child)
        return twin
    if isinstance(value, list):
        return [_twin(v) for v in value]
    if isinstance(value, dict):
        return {k: _twin(v) for k, v in value.items()}
    return value  # arrays and plain values: shared


def _untuned(layer: nn.Module) -> nn.Module:
    """The plain MLX layer a tuned one replaced, on the same arrays."""
    plain_type = nn.QuantizedLinear if isinstance(layer, TunedQuantizedLinear) else nn.QuantizedEmbedding
    plain = plain_type.__new__(plain_type)
    plain.__dict__.update({k: v for k, v in layer.__dict__.items() if k != "_routes"})
    plain.__dict__["_no_grad"] = set(layer._no_grad)
    for key, array in layer.items():
        plain[key] = array
    return plain
