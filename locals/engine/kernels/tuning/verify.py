"""Decide whether a candidate kernel computes what its reference computes, on fresh data.

Errors are measured against a float32 ground truth (dequantize, then matmul) relative to
the largest output; a candidate passes within the rounding allowance of its dtype. Non-
finite output never passes, nor does a candidate that raises or returns the wrong shape
or dtype. (MLX's own op is not the yardstick: its CPU path accumulates bf16 in bf16.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from locals.engine.kernels.qmm_mma import tensor_tile
from locals.engine.kernels.reference import dequantized_matmul, random_problem

# The largest error a correct kernel shows from rounding to the dtype (relative to the
# largest output), with room for another summation order; dropping one group of K=2560
# already costs ~5%.
ERROR_LIMIT = {mx.float32: 1e-4, mx.float16: 4e-3, mx.bfloat16: 2e-2}
# Odd column counts and K spanning an odd number of groups catch edge handling (tuning
# also checks each real layer shape before timing it).
DEFAULT_SHAPES = ((97, 640), (1000, 1920))
DEFAULT_ROWS = (1, 2, 3, 5, 8, 13, 16, 21, 32)
# The truth is computed on the CPU (`dequantized_matmul`): a whole lm_head (151,936 x 2,560) is 389M
# weights dequantized (1.6 GB in float32) and 25 GFLOP at 32 rows, a candidate. A wider layer is
# compared at this many columns, its edge tiles among them (docs/tune.md).
TRUTH_COLUMNS = 1024


@dataclass(frozen=True)
class Case:
    """One problem: `rows` inputs of width `k` times an (n, k) quantized weight."""

    rows: int
    n: int
    k: int
    bits: int
    group_size: int
    dtype: mx.Dtype

    def describe(self) -> str:
        return f"M={self.rows} {self.n}x{self.k} q{self.bits} g{self.group_size} {_dtype_name(self.dtype)}"


@dataclass(frozen=True)
class Verdict:
    """The outcome of one case: passed or not, the measured and allowed error, and why."""

    case: Case
    ok: bool
    error: float
    limit: float
    reason: str = ""


def _dtype_name(dtype) -> str:
    return str(dtype).rsplit(".", 1)[-1]


def default_cases(bits: int, group_size: int, dtype, rows=DEFAULT_ROWS, shapes=DEFAULT_SHAPES) -> list[Case]:
    """Every (rows, shape) pair for one quantization; K is rounded up to whole groups."""
    cases = []
    for n, k in shapes:
        k = -(-k // group_size) * group_size
        cases.extend(Case(m, n, k, bits, group_size, dtype) for m in rows)
    return cases


def _relative_error(got: mx.array, truth: mx.array, scale: float) -> float:
    return (mx.abs(got.astype(mx.float32) - truth).max() / scale).item()


def compare(got: mx.array, truth: mx.array, dtype) -> str:
    """"" when `got` has truth's shape, is `dtype`, finite, and within the dtype's allowance of
    the float32 `truth` (relative to its largest value); otherwise why not. For the fused
    kernels (headprep.py, addnorm.py), whose outputs are not matmuls."""
    if tuple(got.shape) != tuple(truth.shape) or got.dtype != dtype:
        return f"shape/dtype {tuple(got.shape)} {got.dtype} != {tuple(truth.shape)} {dtype}"
    if not mx.all(mx.isfinite(got)).item():
        return "non-finite output"
    error = _relative_error(got, truth, max(mx.abs(truth).max().item(), 1e-6))
    return "" if error <= ERROR_LIMIT[dtype] else f"error {error:.2e} > {ERROR_LIMIT[dtype]:.2e}"


def matches(run: Callable[[], mx.array | tuple[mx.array, ...]], truth: mx.array | tuple[mx.array, ...],
            dtype) -> str:
    """"" when `run()` (a kernel call) returns what `compare` accepts against `truth` (one array
    or a tuple, output by output), otherwise why not; an exception rejects, it is not fatal."""
    try:
        got = run()
        mx.eval(got)
    except Exception as exc:  # a kernel that fails to compile or launch is rejected, not fatal
        return f"raised {type(exc).__name__}: {exc}"
    if isinstance(truth, mx.array):
        return compare(got, truth, dtype)
    return next((why for g, t in zip(got, truth) if (why := compare(g, t, dtype))), "")


def truth_columns(n: int) -> mx.array | None:
    """The output columns compared with the truth: all of them up to TRUTH_COLUMNS (None), else the
    first and last 128 (the edge tiles) and a fresh random sample of the rest."""
    if n <= TRUTH_COLUMNS:
        return None
    rng = np.random.default_rng()
    middle = rng.choice(np.arange(128, n - 128), TRUTH_COLUMNS - 256, replace=False)
    return mx.array(np.sort(np.concatenate([np.arange(128), middle, np.arange(n - 128, n)])).astype(np.uint32))


def check(candidate, case: Case) -> Verdict:
    """Run `candidate` on one fresh random problem and compare it with the float32 truth (on a
    layer wider than TRUTH_COLUMNS, at `truth_columns`; every output must be finite)."""
    x, w, scales, biases = random_problem(case.rows, case.n, case.k, case.bits, case.group_size, case.dtype)
    args = (x, w, scales, biases, case.group_size, case.bits)
    cols = truth_columns(case.n)
    truth = dequantized_matmul(*args) if cols is None else dequantized_matmul(
        x, w[cols], scales[cols], biases[cols], case.group_size, case.bits)
    scale = max(mx.abs(truth).max().item(), 1e-6)
    limit = ERROR_LIMIT[case.dtype]
    try:
        got = candidate(*args)
        mx.eval(got)
    except Exception as exc:  # a kernel that fails to compile or launch is rejected, not fatal
        return Verdict(case, False, float("inf"), limit, f"raised {type(exc).__name__}: {exc}")
    if tuple(got.shape) != (case.rows, case.n):
        return Verdict(case, False, float("inf"), limit, f"shape {tuple(got.shape)} != {(case.rows, case.n)}")
    if got.dtype != x.dtype:
        return Verdict(case, False, float("inf"), limit, f"dtype {got.dtype} != {x.dtype}")
    if not mx.all(mx.isfinite(got)).item():
        return Verdict(case, False, float("nan"), limit, "non-finite output")
    error = _relative_error(got if cols is None else got[:, cols], truth, scale)
    ok = error <= limit  # False for NaN too
    return Verdict(case, ok, error, limit, "" if ok else f"error {error:.2e} > {limit:.2e}")


def verify(candidate, cases: list[Case], stop_at_first_failure: bool = True) -> list[Verdict]:
    """Check every case the candidate supports; by default stop at the first failure."""
    verdicts = []
    for case in cases:
        if not candidate.supports(case.rows, case.bits, case.group_size, case.dtype, case.dtype):
            continue
        verdict = check(candidate, case)
        verdicts.append(verdict)
        if stop_at_first_failure and not verdict.ok:
            break
    return verdicts


def passes(verdicts: list[Verdict]) -> bool:
    """True when at least one case ran and every case passed."""
    return bool(verdicts) and all(v.ok for v in verdicts)


def passing_rows(routes: dict[int, object], usable: Callable[[object], bool],
                 failure: Callable[[object, int], str]) -> set[int]:
    """The row counts of `routes` (rows -> kernel) whose kernel is `usable` and passed
    `failure(kernel, rows)` ("" = passed) for a variant of it (glu.py, normfold.py). One
    check per kernel and compiled row tile (8, 16, 32 rows) at the fewest and the most rows
    it serves, so a layer costs a few checks and every layer of one shape shares them."""
    tiles: dict[tuple[str, int], list[int]] = {}
    for rows, kernel in routes.items():
        if usable(kernel):
            tiles.setdefault((kernel.name, tensor_tile(rows)), []).append(rows)
    ok: set[int] = set()
    for served in tiles.values():
        kernel = routes[served[0]]
        if all(not failure(kernel, m) for m in {min(served), max(served)}):
            ok.update(served)
    return ok
