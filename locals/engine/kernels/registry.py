"""What the engine asks: swap a model's quantized linears for ones that use tuned kernels.

A layer is swapped only when this chip's tuning table (same MLX version, same kernel
sources) chose a verified candidate for the layer's problem at some row count; the
swapped layer uses that candidate for those row counts and MLX's own op for all others.
Without a table nothing changes.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from locals.engine.kernels import glu
from locals.engine.kernels.tuning import MLX_OP, Problem, TuningTable, current_chip, default_candidates, load_table


_bypass = {"depth": 0}  # > 0 while mlx_ops_only() is active
_swaps = {"count": 0}  # bumped by modules_swapped(): compiled graphs of older modules are stale


@contextmanager
def mlx_ops_only() -> Iterator[None]:
    """While active, tuned layers run MLX's own op: measures a peer, or locals without
    kernels, on the same model object side by side (not for concurrent serving)."""
    _bypass["depth"] += 1
    try:
        yield
    finally:
        _bypass["depth"] -= 1


def bypassed() -> bool:
    """Whether `mlx_ops_only()` is active (compiled graphs that traced a kernel must not be reused)."""
    return _bypass["depth"] > 0


def modules_swapped() -> None:
    """Record that some model's modules were replaced (patch_model calls it; so must any
    other code that swaps a served model's layers): compiled graphs trace them again."""
    _swaps["count"] += 1


def swap_count() -> int:
    """How many times modules were swapped in this process (a cheap key for compiled graphs)."""
    return _swaps["count"]


class TunedQuantizedLinear(nn.QuantizedLinear):
    """A QuantizedLinear that routes each call by its row count to the tuned kernel or MLX's op."""

    def __init__(self, layer: nn.QuantizedLinear, kernels: dict[int, object]):
        nn.Module.__init__(self)
        self.group_size, self.bits, self.mode = layer.group_size, layer.bits, getattr(layer, "mode", "affine")
        for name in ("weight", "scales", "biases", "bias"):
            if name in layer:
                self[name] = layer[name]
        # A plain object attribute (not a dict) so it stays out of the parameter tree.
        self._routes = _Routes(kernels)
        self.freeze()

    def __call__(self, x: mx.array) -> mx.array:
        kernel = self._routes.get(math.prod(x.shape[:-1]))
        if kernel is None or _bypass["depth"] or x.dtype != self["scales"].dtype:
            return super().__call__(x)
        y = kernel(x, self["weight"], self["scales"], self["biases"], self.group_size, self.bits)
        return y + self["bias"] if "bias" in self else y

    def glu(self, gu: mx.array) -> mx.array | None:
        """This layer applied to silu(gate) * up for gu = [gate | up], in one kernel where
        glu.py verified it for gu's row count; None otherwise (the caller applies the
        activation and calls the layer)."""
        rows = math.prod(gu.shape[:-1])
        if rows not in self._routes.glu_rows or _bypass["depth"] or gu.dtype != self["scales"].dtype:
            return None
        y = self._routes.get(rows)(gu, self["weight"], self["scales"], self["biases"], self.group_size, self.bits,
                                   glu=True)
        return y + self["bias"] if "bias" in self else y

    def fold_glu(self) -> int:
        """Check the joined gate/up form of this layer's kernels on this device (a down
        projection's; glu.py) and use it for the row counts that pass; returns how many."""
        n, packed = self["weight"].shape
        self._routes.glu_rows = glu.foldable_rows(self._routes.kernels, n, packed * 32 // self.bits, self.bits,
                                                  self.group_size, self["scales"].dtype)
        return len(self._routes.glu_rows)


class _Routes:
    """Row count -> kernel; absent row counts use MLX's op."""

    def __init__(self, kernels: dict[int, object]):
        self.kernels = dict(kernels)
        self.glu_rows: set[int] = set()  # row counts whose kernel also takes [gate | up] (fold_glu)

    def get(self, rows: int):
        return self.kernels.get(rows)

    def __repr__(self) -> str:
        names = sorted({k.name for k in self.kernels.values()})
        folded = f", gate/up folded at rows {sorted(self.glu_rows)}" if self.glu_rows else ""
        return f"rows {sorted(self.kernels)} -> {', '.join(names)}{folded}"


def layer_problem(layer: nn.Module) -> Problem | None:
    """The tuning problem of an affine-quantized linear layer (None for anything else)."""
    if not isinstance(layer, nn.QuantizedLinear) or getattr(layer, "mode", "affine") != "affine":
        return None
    if "biases" not in layer:
        return None
    n, packed = layer["weight"].shape
    dtype = str(layer["scales"].dtype).rsplit(".", 1)[-1]
    return Problem(n, packed * 32 // layer.bits, layer.bits, layer.group_size, dtype)


def _routes_for(problem: Problem, table: TuningTable, by_name: dict[str, object]) -> dict[int, object]:
    routes = {}
    for rows, name in table.choices.get(problem.key, {}).items():
        if name != MLX_OP and name in by_name and name not in table.rejected:
            routes[int(rows)] = by_name[name]
    return routes


def _candidates_by_name() -> dict[str, object]:
    kind, _chip = current_chip()
    return {c.name: c for c in default_candidates(kind)}


def tuned_linear(layer: nn.Module, table: TuningTable | None = None, candidates: dict | None = None) -> nn.Module:
    """`layer` itself, or a TunedQuantizedLinear when this chip has a faster verified kernel for it."""
    table = table if table is not None else load_table()
    problem = layer_problem(layer)
    if table is None or problem is None or isinstance(layer, TunedQuantizedLinear):
        return layer
    routes = _routes_for(problem, table, candidates if candidates is not None else _candidates_by_name())
    return TunedQuantizedLinear(layer, routes) if routes else layer


def patch_model(model: nn.Module, table: TuningTable | None = None) -> int:
    """Swap every quantized linear that has a tuned kernel on this chip; returns how many."""
    table = table if table is not None else load_table()
    if table is None:
        return 0
    candidates = _candidates_by_name()
    swaps = []
    for path, layer in model.named_modules():
        tuned = tuned_linear(layer, table, candidates)
        if tuned is not layer:
            swaps.append((path, tuned))
    # Opt-in: on the H200 it verified, but decoded B = 8 slower than the unfolded layers in three
    # of four pairs of processes (median 1525 vs 1677 tok/s, process_spread-gpu-20261201-014127.json).
    fold = os.environ.get("LOCALS_GLU_FOLD", "").strip().lower() in ("1", "true", "on", "yes")
    for path, tuned in swaps:
        if fold and path.endswith("mlp.down_proj"):  # takes the joined gate/up output as it is (forward.py)
            tuned.fold_glu()
    if swaps:
        model.update_modules(tree_unflatten(swaps))
        modules_swapped()
    return len(swaps)
