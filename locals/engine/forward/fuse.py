"""Join the linears that read the same input (q/k/v, gate/up) into one matmul per layer block.

A short pass then launches one matmul where it launched three (attention) or two (MLP):
three kernels fewer per layer, which is what a host-bound step at small batches pays for
(the engine's ForwardChoices say up to how many tokens a pass uses them: every pass, except
q/k/v on CUDA without the fused q/k kernel, up to 4; longer passes run the parts). The model
still runs as mlx-lm wrote it: the old attributes
(q_proj, gate_proj, ...) become `PartOf` views that run their own rows of the joined weight
with the same op, so mlx-lm's forward (the peer side of the benchmarks shares the object)
computes what it did before. Only llama/qwen-family blocks whose parts are all plain
`nn.Linear` or all `nn.QuantizedLinear` with the same settings are joined.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from locals.engine.kernels.registry import modules_swapped

# (block attribute, joined attribute, parts in output order)
GROUPS = (
    ("self_attn", "fused_qkv", ("q_proj", "k_proj", "v_proj")),
    ("mlp", "fused_gate_up", ("gate_proj", "up_proj")),
)
_QUANT_SETTINGS = ("group_size", "bits", "mode")


def fuse_projections(model) -> int:
    """Join every layer's q/k/v and gate/up linears in place; returns how many groups were
    joined (0 for other architectures, or when already joined)."""
    layers = getattr(getattr(model, "model", None), "layers", None) or []
    joined = 0
    for layer in layers:
        for block_name, fused_name, parts in GROUPS:
            block = getattr(layer, block_name, None)
            if block is None or fused_name in block:
                continue
            linears = [block.get(p) for p in parts]
            fused = _join(linears)
            if fused is None:
                continue
            mx.eval(fused.parameters())  # one block at a time: the parts' memory frees as we go
            block[fused_name] = fused
            start = 0
            for name, part in zip(parts, linears):
                rows = part.weight.shape[0]
                block[name] = PartOf(fused, start, start + rows)
                start += rows
            joined += 1
    if joined:
        modules_swapped()
    return joined


def split_sizes(block, fused_name: str) -> list[int]:
    """Where the joined output splits into its parts (the cut points for `mx.split`)."""
    parts = next(p for _, f, p in GROUPS if f == fused_name)
    cuts, total = [], 0
    for name in parts[:-1]:
        total += block[name].weight.shape[0]
        cuts.append(total)
    return cuts


def _join(linears: list) -> nn.Module | None:
    """One linear whose output rows are the parts' rows in order, or None when they cannot join."""
    if any(p is None for p in linears) or len({type(p) for p in linears}) != 1:
        return None
    kind = type(linears[0])
    if kind not in (nn.Linear, nn.QuantizedLinear):
        return None
    if len({p.weight.shape[1:] for p in linears}) != 1 or len({"bias" in p for p in linears}) != 1:
        return None
    fused = kind.__new__(kind)
    nn.Module.__init__(fused)
    if kind is nn.QuantizedLinear:
        settings = {tuple(getattr(p, s, None) for s in _QUANT_SETTINGS) for p in linears}
        if len(settings) != 1 or not all("biases" in p for p in linears):
            return None
        fused.group_size, fused.bits, fused.mode = next(iter(settings))
    for key in ("weight", "scales", "biases", "bias"):
        if key in linears[0]:
            fused[key] = mx.concatenate([p[key] for p in linears], axis=0)
    fused.freeze()
    return fused


class PartOf(nn.Module):
    """Rows [start, stop) of a joined linear, run with the op of the linear it replaced.

    Holds no parameters of its own (the rows are views into the joined weight), so the model's
    parameter tree has each weight once."""

    def __init__(self, fused: nn.Module, start: int, stop: int):
        super().__init__()
        # A plain object attribute keeps the views out of the parameter tree.
        views = {k: fused[k][start:stop] for k in ("weight", "scales", "biases", "bias") if k in fused}
        mx.eval(list(views.values()))  # views, evaluated once: no slicing left for each call
        self._rows = _Rows(views, {s: getattr(fused, s) for s in _QUANT_SETTINGS if hasattr(fused, s)})

    @property
    def weight(self) -> mx.array:
        return self._rows.arrays["weight"]

    def __call__(self, x: mx.array) -> mx.array:
        a, settings = self._rows.arrays, self._rows.settings
        if "scales" in a:
            y = mx.quantized_matmul(x, a["weight"], scales=a["scales"], biases=a["biases"], transpose=True,
                                    **settings)
        else:
            y = x @ a["weight"].T
        return y + a["bias"] if "bias" in a else y


class _Rows:
    """The views and quantization settings of one `PartOf`."""

    def __init__(self, arrays: dict, settings: dict):
        self.arrays, self.settings = arrays, settings
