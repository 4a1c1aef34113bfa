"""What the engine asks: swap a model's quantized linears for ones that use tuned kernels.

A layer is swapped only when this chip's tuning table (same MLX version, same kernel
sources) chose a verified candidate for the layer's problem at some row count; the
swapped layer uses that candidate for those row counts and MLX's own op for all others.
Without a table nothing changes, but on CUDA (`route_wide_passes`): wide passes, prompt chunks,
run a dense matmul, on copies of the weights dequantized once where they fit (from DENSE_ROWS
rows), else on the weights dequantized for the call (from WIDE_ROWS rows).
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from locals.engine.kernels import glu, normfold
from locals.engine.kernels.reference import DenseCopy, DequantizedCandidate
from locals.engine.kernels.resident import float_constant
from locals.engine.kernels.tuning.tuner import (MLX_OP, Problem, TuningTable, current_chip, default_candidates,
                                                fill_rows, load_table, problem_of, tied_head)

# From this many rows a dense matmul on the dequantized weights beats MLX 0.32's CUDA quantized
# matmul, whose time grows with the rows as if each row tile read the weights again: 1.0-1.1x at
# 256 rows, 1.5-1.8x at 512, 2.9-3.3x at 2,048 (docs/benchmarks-log.md, "Prompt chunks: dense matmuls on CUDA").
WIDE_ROWS = 256
# With dense copies of the weights kept beside the quantized ones, passes of this many rows or more
# multiply those: Qwen3-4B's matmuls took 4.1 ms against MLX's quantized 4.3 at 64 rows, 4.3 against
# 13.7 (and 12.3 dequantizing per call) at 256 on an H100, MLX's a little faster at 33 (3.9 against
# 4.3); MLX's doubles past 64 rows (a second row tile): a 72-row pass's 8.0 ms fell to 4.9
# (docs/benchmarks-log.md, "Dense copies of the weights for prompt chunks"). The copies are kept
# where they take at most DENSE_SHARE of the card's memory (Qwen3-4B's: 7.3 GB in bfloat16), else
# that memory stays the caches'.
DENSE_ROWS = 64
DENSE_SHARE = 1 / 8

_swaps = {"count": 0}  # bumped by modules_swapped(): compiled graphs of older modules are stale


def modules_swapped() -> None:
    """Record that some model's modules were replaced (patch_model calls it; so must any
    other code that swaps a served model's layers): compiled graphs trace them again."""
    _swaps["count"] += 1


def swap_count() -> int:
    """How many times modules were swapped in this process (a cheap key for compiled graphs)."""
    return _swaps["count"]


class TunedQuantizedLinear(nn.QuantizedLinear):
    """A QuantizedLinear that routes each call by its row count to the tuned kernel or MLX's op."""

    def __init__(self, layer: nn.QuantizedLinear, kernels: dict[int, object], wide=None):
        nn.Module.__init__(self)
        self.group_size, self.bits, self.mode = layer.group_size, layer.bits, getattr(layer, "mode", "affine")
        for name in ("weight", "scales", "biases", "bias"):
            if name in layer:
                self[name] = layer[name]
        # A plain object attribute (not a dict) so it stays out of the parameter tree.
        self._routes = _Routes(kernels, wide)
        self.freeze()

    def __call__(self, x: mx.array) -> mx.array:
        y = _routed(self, x)
        if y is None:
            return super().__call__(x)
        return y + self["bias"] if "bias" in self else y

    def gated(self, x: mx.array) -> mx.array | None:
        """silu(gate) * up for this joined [gate | up] layer's output on x, in one kernel where
        glu.py verified it for x's row count; None otherwise (the caller runs the layer and the activation)."""
        rows = math.prod(x.shape[:-1])
        if rows not in self._routes.gated_rows or x.dtype != self["scales"].dtype or "bias" in self:
            return None
        return self._routes.get(rows)(x, self["weight"], self["scales"], self["biases"], self.group_size, self.bits,
                                      gated=True)

    def add_norm(self, x: mx.array, h: mx.array, norm: nn.Module) -> tuple[mx.array, mx.array] | None:
        """(h + this layer(x), norm of that) in one kernel where normfold.py verified it for x's
        row count and `norm` is a plain RMSNorm; None otherwise (the caller calls the layer,
        adds and normalizes)."""
        rows = math.prod(x.shape[:-1])
        if (rows not in self._routes.norm_rows or x.dtype != self["scales"].dtype or "bias" in self
                or type(norm) is not nn.RMSNorm):
            return None
        h2, xn = self._routes.get(rows).add_norm(x.reshape(rows, x.shape[-1]), h.reshape(rows, h.shape[-1]),
                                                  norm.weight, float_constant(norm.eps), self._routes.count,
                                                  self["weight"], self["scales"], self["biases"], self.group_size)
        return h2.reshape(h.shape), xn.reshape(h.shape)

    def fold_norm(self, eps: float) -> int:
        """Check the residual add + RMSNorm form of this layer's kernels on this device (an
        o_proj's or down_proj's; normfold.py) and use it for the row counts that pass; returns how many."""
        self._routes.norm_rows = normfold.foldable_rows(self._routes.kernels, *self._problem(), eps)
        if self._routes.norm_rows and self._routes.count is None:
            self._routes.count = normfold.counter()
        return len(self._routes.norm_rows)

    def fold_gated(self) -> int:
        """Check the gated form of this layer's kernels on this device (a joined gate/up
        projection's; glu.py) and use it for the row counts that pass; returns how many."""
        self._routes.gated_rows = glu.gated_rows(self._routes.kernels, *self._problem())
        return len(self._routes.gated_rows)

    def _problem(self) -> tuple:
        """(n, k, bits, group size, dtype) of this layer, as the fold checks take them."""
        n, packed = self["weight"].shape
        return n, packed * 32 // self.bits, self.bits, self.group_size, self["scales"].dtype


class TunedQuantizedEmbedding(nn.QuantizedEmbedding):
    """A tied model's QuantizedEmbedding whose `as_linear` (the lm_head) routes each call by its
    row count like TunedQuantizedLinear; looking tokens up stays MLX's."""

    def __init__(self, layer: nn.QuantizedEmbedding, kernels: dict[int, object]):
        nn.Module.__init__(self)
        self.group_size, self.bits, self.mode = layer.group_size, layer.bits, layer.mode
        self.num_embeddings, self.dims = layer.num_embeddings, layer.dims
        for name in ("weight", "scales", "biases"):
            self[name] = layer[name]
        self._routes = _Routes(kernels)
        self.freeze()

    def as_linear(self, x: mx.array) -> mx.array:
        y = _routed(self, x)
        return super().as_linear(x) if y is None else y


def _routed(layer, x: mx.array) -> mx.array | None:
    """`layer`'s weights applied to x by the kernel tuned for x's row count; None where MLX's op serves."""
    kernel = layer._routes.get(math.prod(x.shape[:-1]))
    if kernel is None or x.dtype != layer["scales"].dtype:
        return None
    return kernel(x, layer["weight"], layer["scales"], layer["biases"], layer.group_size, layer.bits)


class _Routes:
    """Row count -> kernel; `wide` from `wide_from` rows on; other row counts use MLX's op."""

    def __init__(self, kernels: dict[int, object], wide=None, wide_from: int = WIDE_ROWS):
        self.kernels = dict(kernels)
        self.wide, self.wide_from = wide, wide_from
        self.gated_rows: set[int] = set()  # row counts whose kernel writes silu(gate) * up (fold_gated)
        self.norm_rows: set[int] = set()  # ... whose kernel also adds the residual and normalizes (fold_norm)
        self.count = None  # the add + norm kernel's launch counter, this layer's own (normfold.py)

    def get(self, rows: int):
        kernel = self.kernels.get(rows)
        return self.wide if kernel is None and rows >= self.wide_from else kernel

    def __repr__(self) -> str:
        names = sorted({k.name for k in self.kernels.values()})
        folded = f", {self.wide.name} from {self.wide_from} rows" if self.wide is not None else ""
        folded += f", silu(gate) * up at rows {sorted(self.gated_rows)}" if self.gated_rows else ""
        folded += f", add + norm folded at rows {sorted(self.norm_rows)}" if self.norm_rows else ""
        return f"rows {sorted(self.kernels)} -> {', '.join(names)}{folded}"


def layer_problem(layer: nn.Module) -> Problem | None:
    """The tuning problem of an affine-quantized linear layer (None for anything else)."""
    return problem_of(layer) if isinstance(layer, nn.QuantizedLinear) else None


def _routes_for(problem: Problem, table: TuningTable, by_name: dict[str, object]) -> dict[int, object]:
    """Row count -> kernel for `problem`: the table's choices, plus the row counts it lacks (see _fill_in)."""
    chosen = {int(rows): name for rows, name in table.choices.get(problem.key, {}).items()}
    routes = {rows: by_name[name] for rows, name in chosen.items()
              if name != MLX_OP and name in by_name and name not in table.rejected}
    return _fill_in(routes, chosen, problem, fill_rows(table.chip.split(":", 1)[0]))


def _fill_in(routes: dict[int, object], chosen: dict[int, str], problem: Problem, tunable: list[int]) -> dict:
    """A tunable row count the table has no choice for takes the kernel chosen for the nearest
    tuned count above it, when that kernel runs both in one compiled row tile (so it does the
    same work, and passed screening at row counts inside every tile). A table tuned at 2, 4, 8,
    16 and 32 rows otherwise leaves 3, 5-7, 9-15 and 17-31 to MLX's op, which on CUDA re-reads
    the weights once per row below 8 (docs/benchmarks-log.md, "Small-batch kernels vs
    `mx.quantized_matmul`") - the sizes a team passes through as its agents start and finish."""
    filled = dict(routes)
    for rows in tunable:
        if rows in chosen:
            continue
        above = min((t for t in chosen if t > rows), default=None)
        kernel = routes.get(above)  # None where MLX's op won there (or the choice is unusable)
        tile = getattr(kernel, "compiled_rows", None)  # MLX-op candidates have none: no fill-in
        if (tile is not None and tile(rows) == tile(above)
                and kernel.supports(rows, problem.bits, problem.group_size, problem.mx_dtype, problem.mx_dtype)):
            filled[rows] = kernel
    return filled


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


def tuned_head(model: nn.Module, table: TuningTable, candidates: dict) -> TunedQuantizedEmbedding | None:
    """A routed replacement for a tied model's embedding when this chip tuned its lm_head
    problem (MLX's op on it was a fifth of a B = 4 step's device time on the H200:
    docs/benchmarks-log.md, "Side by side with mlx-lm again"); None otherwise."""
    head = tied_head(model)
    if head is None or isinstance(head, TunedQuantizedEmbedding):
        return None
    routes = _routes_for(problem_of(head), table, candidates)
    return TunedQuantizedEmbedding(head, routes) if routes else None


def patch_model(model: nn.Module, table: TuningTable | None = None) -> int:
    """Swap every quantized linear (and a tied lm_head) that has a tuned kernel on this chip;
    returns how many."""
    table = table if table is not None else load_table()
    if table is None:
        return 0
    candidates = _candidates_by_name()
    swaps = []
    for path, layer in model.named_modules():
        tuned = tuned_linear(layer, table, candidates)
        if tuned is not layer:
            swaps.append((path, tuned))
    head = tuned_head(model, table, candidates)
    if head is not None:
        swaps.append(("model.embed_tokens", head))
    for path, tuned in swaps:
        _fold_activation(path, tuned)
    if swaps:
        model.update_modules(tree_unflatten(swaps))
        fold_norms(model)
        modules_swapped()
    return len(swaps)


def route_wide_passes(model: nn.Module, memory_bytes: int = 0) -> int:
    """On CUDA: every quantized linear (tuned or not; not a tied head, which reads a pass's last
    tokens only) takes wide passes to a dense matmul: on a copy of its weights dequantized now
    when all the copies fit in DENSE_SHARE of `memory_bytes` (the card's), from DENSE_ROWS rows;
    else on its weights dequantized for the call, from WIDE_ROWS rows. Returns how many layers."""
    layers = [(path, layer) for path, layer in model.named_modules()
              if isinstance(layer, TunedQuantizedLinear) or layer_problem(layer) is not None]
    copies = dense_copy_bytes([layer for _, layer in layers]) <= memory_bytes * DENSE_SHARE
    shared, swaps = DequantizedCandidate(), []
    for path, layer in layers:
        wide = DenseCopy(layer["weight"], layer["scales"], layer["biases"], layer.group_size,
                         layer.bits) if copies else shared
        if not isinstance(layer, TunedQuantizedLinear):
            layer = TunedQuantizedLinear(layer, {})
            swaps.append((path, layer))
        layer._routes.wide, layer._routes.wide_from = wide, DENSE_ROWS if copies else WIDE_ROWS
    if swaps:
        model.update_modules(tree_unflatten(swaps))
    if layers:
        modules_swapped()
    return len(layers)


def kept_copy_bytes(model: nn.Module) -> int:
    """Bytes of the dense copies `route_wide_passes` kept for `model`'s layers (0: none)."""
    return sum(layer._routes.wide.weight.nbytes for _, layer in model.named_modules()
               if isinstance(layer, TunedQuantizedLinear) and isinstance(layer._routes.wide, DenseCopy))


def dense_copy_bytes(layers: list[nn.Module]) -> int:
    """Bytes of the quantized `layers`' weights dequantized to their scales' dtype."""
    return sum(layer["scales"].dtype.size * layer["weight"].shape[0] * layer["weight"].shape[1] * 32 // layer.bits
               for layer in layers)


def _fold_activation(path: str, tuned: TunedQuantizedLinear) -> None:
    """SwiGLU into a joined gate/up kernel: it writes silu(gate) * up (layer_pass's `finish`)."""
    if path.endswith("mlp.fused_gate_up"):
        tuned.fold_gated()


# The linears whose output a llama/qwen-family layer adds to the residual stream and normalizes.
NORMED_OUTPUTS = (("self_attn", "o_proj"), ("mlp", "down_proj"))


def fold_norms(model: nn.Module) -> int:
    """Fold the residual add + RMSNorm after each layer's tuned o_proj and down_proj into
    their kernels, where those verify that form (normfold.py); returns how many linears."""
    folded = 0
    for layer in getattr(getattr(model, "model", None), "layers", None) or []:
        norm = getattr(layer, "post_attention_layernorm", None)
        for block_name, linear_name in NORMED_OUTPUTS:
            linear = getattr(getattr(layer, block_name, None), linear_name, None)
            if type(norm) is nn.RMSNorm and isinstance(linear, TunedQuantizedLinear) and not linear._routes.norm_rows:
                folded += bool(linear.fold_norm(float(norm.eps)))
    return folded


def folded_counts(model: nn.Module) -> dict[str, int]:
    """How many linears run more than their matmul in their kernel: "norms", o_proj/down_proj
    with the residual add + norm after them; "activations", joined gate/up writing silu(gate) * up."""
    norms = activations = 0
    for layer in getattr(getattr(model, "model", None), "layers", None) or []:
        for block_name, linear_name in NORMED_OUTPUTS:
            linear = getattr(getattr(layer, block_name, None), linear_name, None)
            norms += isinstance(linear, TunedQuantizedLinear) and bool(linear._routes.norm_rows)
        gate_up = getattr(getattr(layer, "mlp", None), "fused_gate_up", None)
        activations += isinstance(gate_up, TunedQuantizedLinear) and bool(gate_up._routes.gated_rows)
    return {"norms": norms, "activations": activations}

