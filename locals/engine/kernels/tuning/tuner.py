"""Time verified candidates per (problem, rows) and remember the fastest, per chip and MLX version.

A candidate first verifies itself on fresh random data (verify.py) for each quantization
it will serve; one failure and it is never timed nor stored. Timing interleaves the
candidates and MLX's own op in rounds and keeps every sample; a candidate replaces
MLX's op for a (problem, rows) only when its median is faster by more than MARGIN. The
table lives in `cache_dir()/tuning/`, one JSON file per chip + MLX version; without one, a
table shipped in `shipped/` for the same chip, MLX version and kernel sources serves, and
`locals tune` refines it (times only the pairs it lacks) into the user's own.
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import mlx.core as mx

from locals.atomic_file import write_atomically
from locals.config import cache_dir
from locals.engine.kernels import cubin, qmm
from locals.engine.kernels.tuning import clock
from locals.engine.kernels.reference import (DequantizedCandidate, PaddedCandidate, cold_problems, quantized_matmul,
                                             random_problem, random_rows, rotating)
from locals.engine.kernels.tuning.verify import DEFAULT_ROWS, DEFAULT_SHAPES, Case, check, default_cases, passes, verify

MLX_OP = "mlx"  # the choice that means "keep MLX's own quantized_matmul"
MARGIN = 0.03
# Host work per kernel a call queues, weighed against device time on CUDA: a small-batch decode
# step on the H200 spent its time building and queuing kernels while the device waited, and a
# K-split call's second kernel, which saved device time, made the table that took it decode
# slower (docs/benchmarks-log.md, "Tuning by device time, and where a B = 8 step's time goes").
HOST_US_PER_LAUNCH = 10.0
# 2: CUDA tables timed by device time (clock.py); tables timed by the host clock are re-tuned.
FORMAT = 2
# Tables `locals tune` made on chips we ran (`locals tune --model <the model>`; docs/tune.md, "Shipped tables").
SHIPPED_TABLES = Path(__file__).resolve().parent / "shipped"


@dataclass(frozen=True)
class Problem:
    """The shape of one quantized linear layer: an (n, k) weight, its quantization and dtype."""

    n: int
    k: int
    bits: int
    group_size: int
    dtype: str  # "bfloat16" | "float16" | "float32"

    @property
    def key(self) -> str:
        return f"q{self.bits}-g{self.group_size}-{self.dtype}-{self.n}x{self.k}"

    @property
    def mx_dtype(self):
        return getattr(mx, self.dtype)


@dataclass
class TuningTable:
    """What tuning chose on one chip: per problem key, per row count, a candidate name or "mlx"."""

    chip: str
    mlx: str
    kernels: str  # source tag of the kernels timed; a different tag means "untuned"
    choices: dict[str, dict[str, str]] = field(default_factory=dict)
    timings_us: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)
    complete: bool = False
    format: int = FORMAT
    clock: str = "host"  # what the timings are: "device" (CUDA stamps, clock.py) or "host"

    def choice(self, key: str, rows: int) -> str:
        return self.choices.get(key, {}).get(str(rows), MLX_OP)


def tuning_rows(backend: str) -> list[int]:
    """Row counts `locals tune` times on `backend`: on CUDA the row tiles' edges 2, 4, 8, 16 and
    32 (the counts between take the choice above them in the same tile, registry._fill_in; one
    row keeps MLX's kernel or takes two rows' choice, `fill_rows`), 1..MAX_ROWS elsewhere."""
    if backend == "cuda":
        return [m for m in (2, 4, 8, 16, qmm.WIDE_MAX_ROWS) if m <= qmm.WIDE_MAX_ROWS]
    return list(range(1, qmm.MAX_ROWS + 1))


def fill_rows(backend: str) -> list[int]:
    """Row counts a chosen kernel may serve without being timed there (registry._fill_in): on
    CUDA every count up to WIDE_MAX_ROWS, one row included (it takes two rows' choice, with its
    folds: fewer operations a step than MLX's matmuls, and a one-stream step is host-bound;
    docs/tune.md); elsewhere the tuned ones."""
    return list(range(1, qmm.WIDE_MAX_ROWS + 1)) if backend == "cuda" else tuning_rows(backend)


def current_chip() -> tuple[str, str]:
    """(backend kind, a stable name of this chip) as MLX reports them."""
    from locals.engine.load.backend import detect

    backend = detect()
    return backend.kind, f"{backend.kind}:{backend.device_name}"


def kernels_tag(kind: str) -> str:
    return {"cuda": qmm.CUDA_TAG, "metal": qmm.METAL_TAG}.get(kind, "none")


def table_path(chip: str, mlx_version: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", f"{chip}-mlx{mlx_version}").strip("-").lower()
    return cache_dir() / "tuning" / f"{slug}.json"


def new_table() -> TuningTable:
    """An empty table for this chip, MLX version and kernel sources."""
    kind, chip = current_chip()
    return TuningTable(chip=chip, mlx=mx.__version__, kernels=kernels_tag(kind))


def load_table(chip: str | None = None) -> TuningTable | None:
    """This chip + MLX version's table: the user's, else the shipped one (None when neither fits
    this MLX version and these kernel sources)."""
    kind, chip_name = current_chip() if chip is None else (chip.split(":", 1)[0], chip)
    path = table_path(chip_name, mx.__version__)
    return read_table(path, kind) or read_table(SHIPPED_TABLES / path.name, kind)


def read_table(path: Path, kind: str) -> TuningTable | None:
    """The table in `path` when it was tuned on this MLX version with these `kind` kernel sources."""
    try:
        table = TuningTable(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    if table.format != FORMAT or table.kernels != kernels_tag(kind) or table.mlx != mx.__version__:
        return None
    return table


def save_table(table: TuningTable) -> Path:
    """Write the table atomically; returns its path."""
    path = table_path(table.chip, table.mlx)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, [json.dumps(asdict(table), indent=1, sort_keys=True).encode()])
    return path


def default_candidates(kind: str) -> list:
    """Every candidate for `kind`: the device kernels plus the plain-MLX alternatives."""
    return [*qmm.candidates(kind), PaddedCandidate(8), DequantizedCandidate()]


def wall_time(fn: Callable[[], mx.array], repeats: int) -> float:
    """Host seconds per call of `repeats` calls evaluated together (building them included)."""
    start = time.perf_counter()
    mx.eval([fn() for _ in range(repeats)])
    return (time.perf_counter() - start) / repeats


def measure(fns: dict[str, Callable[[], mx.array]], rounds: int = 7, repeats: int = 20,
            pause: Callable[[], bool] | None = None,
            timer: Callable[[Callable, int], float] = wall_time) -> dict[str, list[float]] | None:
    """Seconds per call of each function: interleaved rounds, every sample kept.

    Each sample times `repeats` calls together (`timer`: the host clock by default, or
    clock.py's device stamps on CUDA), because timing only the last of several lazy results
    would miss the others; functions made by `rotating` take a new copy of the weights each
    call (`cold_problems`) and chain the calls, so they run one after another on the device
    as a model's layers do. None when `pause()` turned True between rounds (the samples are
    incomplete and dropped).
    """
    for fn in fns.values():
        timer(fn, 1)  # compile and warm up outside the samples
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        if pause is not None and pause():
            return None
        for name, fn in fns.items():
            samples[name].append(timer(fn, repeats))
    return samples


def screen(candidates: list, problems: list[Problem], table: TuningTable,
           progress: Callable[[str], None] | None = None, shapes=DEFAULT_SHAPES,
           pause: Callable[[], bool] | None = None, max_rows: int = qmm.MAX_ROWS) -> list | None:
    """Candidates that pass the full verification sweep for every quantization in `problems`,
    up to `max_rows` rows (failures are recorded in `table.rejected`); None when `pause()`
    turned True between two cases (each case may compile a kernel: ~seconds on CUDA, so a
    request waits one)."""
    progress = progress or (lambda _msg: None)
    quants = sorted({(p.bits, p.group_size, p.dtype) for p in problems})
    rows = sorted({m for m in DEFAULT_ROWS if m <= max_rows} | {max_rows})
    compile_candidates([c for c in candidates if c.name not in table.rejected], quants, rows, progress)
    kept = []
    for cand in candidates:
        if cand.name in table.rejected:
            continue
        progress(f"verifying {cand.name}")
        for bits, group, dtype in quants:
            verdicts = []
            for case in default_cases(bits, group, getattr(mx, dtype), rows=rows, shapes=shapes):
                if pause is not None and pause():
                    return None
                verdicts += verify(cand, [case])
                if verdicts and not verdicts[-1].ok:
                    break
            if verdicts and not passes(verdicts):
                bad = next(v for v in verdicts if not v.ok)
                table.rejected[cand.name] = f"{bad.case.describe()}: {bad.reason}"
                progress(f"rejected {cand.name}: {table.rejected[cand.name]}")
                break
        else:
            kept.append(cand)
    return kept


def compile_candidates(candidates: list, quants: list[tuple], rows: list[int],
                       progress: Callable[[str], None]) -> None:
    """On CUDA, compile every kernel the candidates launch for these quantizations and row counts,
    and the device clock's, at once (cubin.py) instead of one at a time as each is first verified
    (docs/tune.md: a cold `locals tune` took 97 s, from 239). Timing launches the same kernels."""
    ours = [c for c in candidates if getattr(c, "backend", None) == "cuda"]
    if not ours or current_chip()[0] != "cuda":
        return
    launches = []
    for bits, group, dtype in quants:
        x, w, scales, biases = random_problem(max(rows), 64, 2 * group, bits, group, getattr(mx, dtype))
        launches += [lambda c=c, m=m: c(x[:m], w, scales, biases, group, bits)
                     for c in ours for m in rows if c.supports(m, bits, group, x.dtype, x.dtype)]
        launches += [lambda x=x: clock.stamp(x, x.dtype), lambda x=x: clock.stamp(mx.zeros((2,), mx.uint32), x.dtype)]
    progress("compiling the candidates' kernels")
    start = time.perf_counter()
    outcome = cubin.compile_ahead(launches)
    progress(f"compiled {len(outcome)} kernels in {time.perf_counter() - start:.1f} s")


def _tune_one(problem: Problem, rows: int, candidates: list, rounds: int, repeats: int,
              pause: Callable[[], bool] | None = None, copies: list | None = None) -> tuple[str, dict] | None:
    """The fastest verified choice for one (problem, rows) and the median microseconds of each;
    None when `pause()` interrupted the timing. `copies`: the problem's cold weights, when
    the caller made them once for all its row counts."""
    dtype = problem.mx_dtype
    usable = [c for c in candidates if c.supports(rows, problem.bits, problem.group_size, dtype, dtype)]
    case = Case(rows, problem.n, problem.k, problem.bits, problem.group_size, dtype)
    usable = [c for c in usable if check(c, case).ok]  # this exact shape, fresh data
    if copies is None:
        copies = cold_problems(1, problem.n, problem.k, problem.bits, problem.group_size, dtype)[1]
    x = random_rows(rows, problem.k, dtype)
    turn = itertools.cycle(copies)  # shared: consecutive samples read different copies
    fns = {name: rotating(fn, x, copies, problem.group_size, problem.bits, turn)
           for name, fn in [(MLX_OP, quantized_matmul), *((c.name, c) for c in usable)]}
    device_timer = clock.timer(dtype)
    if device_timer is not None:  # CUDA: device time of as many calls as one CUDA graph holds,
        # in three times the rounds (a sample is a few calls; the timer ticks in ~1 us or less)
        samples = measure(fns, 3 * rounds, clock.calls_per_graph(), pause, device_timer)
    else:
        samples = measure(fns, rounds, max(repeats, len(copies)), pause)
    if samples is None:
        return None
    medians = {name: statistics.median(s) * 1e6 for name, s in samples.items()}
    # The host clock already holds each call's host work; device time does not, so a call
    # that queues more kernels pays for the extra ones.
    extra = {c.name: HOST_US_PER_LAUNCH * (getattr(c, "launches", 1) - 1) if device_timer else 0.0 for c in usable}
    cost = {name: us + extra.get(name, 0.0) for name, us in medians.items()}
    best = min(cost, key=cost.get)
    choice = best if cost[best] < cost[MLX_OP] * (1 - MARGIN) else MLX_OP
    return choice, {name: round(us, 2) for name, us in medians.items()}


def tune(problems: list[Problem], rows: range | list[int] | None = None, candidates=None,
         table: TuningTable | None = None, pause: Callable[[], bool] | None = None,
         progress: Callable[[str], None] | None = None, rounds: int = 7, repeats: int = 20,
         screen_shapes=DEFAULT_SHAPES, screened: bool = False,
         on_pair: Callable[[], None] | None = None) -> TuningTable:
    """Tune every (problem, rows) not yet in `table` (rows: this backend's `tuning_rows`);
    stops early (complete=False) when `pause()`. `on_pair()` after each pair is chosen.

    Candidates are first screened on `screen_shapes` (odd sizes) for every quantization,
    unless `screened` says `candidates` already passed `screen`.
    """
    kind = current_chip()[0]
    rows = tuning_rows(kind) if rows is None else list(rows)
    progress = progress or (lambda _msg: None)
    if table is None:
        table = new_table()
    table.complete = False  # until every (problem, rows) asked for here is done
    table.clock = "device" if clock.timer(mx.float16) is not None else "host"
    pool = default_candidates(kind) if candidates is None else candidates
    if not screened:
        pool = screen(pool, problems, table, progress, screen_shapes, pause=pause, max_rows=max(rows))
        if pool is None:  # paused while verifying: nothing timed yet
            return table
    for problem in problems:
        done = table.choices.setdefault(problem.key, {})
        copies = None  # made once a problem, for all its row counts
        for m in rows:
            if str(m) in done:
                continue
            if pause is not None and pause():
                return table
            if copies is None:
                copies = cold_problems(1, problem.n, problem.k, problem.bits, problem.group_size,
                                       problem.mx_dtype)[1]
            tuned = _tune_one(problem, m, pool, rounds, repeats, pause, copies)
            if tuned is None:
                return table
            choice, timings = tuned
            done[str(m)] = choice
            table.timings_us.setdefault(problem.key, {})[str(m)] = timings
            progress(f"{problem.key} M={m}: {choice} ({timings[choice]:.1f} us, mlx {timings[MLX_OP]:.1f} us)")
            if on_pair is not None:
                on_pair()
    table.complete = True
    return table


def problem_of(layer) -> Problem | None:
    """The tuning problem of an affine-quantized linear layer or embedding (None for anything else)."""
    import mlx.nn as nn

    if not isinstance(layer, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
        return None
    if getattr(layer, "mode", "affine") != "affine" or "biases" not in layer or layer["biases"] is None:
        return None
    n, packed = layer["weight"].shape
    dtype = str(layer["scales"].dtype).rsplit(".", 1)[-1]
    return Problem(n, packed * 32 // layer.bits, layer.bits, layer.group_size, dtype)


def tied_head(model):
    """The quantized embedding a model also runs as its output projection (tied weights: the
    lm_head is `embed_tokens.as_linear`, the largest matmul of a decode step), or None."""
    import mlx.nn as nn

    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    tied = getattr(getattr(model, "args", None), "tie_word_embeddings", False) or not hasattr(model, "lm_head")
    return embed if tied and isinstance(embed, nn.QuantizedEmbedding) and problem_of(embed) is not None else None


def model_problems(model) -> list[Problem]:
    """The distinct quantized-linear problems of a model (affine 4/8-bit layers, and a tied
    lm_head), largest weight first: a tuning run that stops early has done the layers that
    matter most."""
    import mlx.nn as nn

    layers = [layer for _path, layer in model.named_modules() if isinstance(layer, nn.QuantizedLinear)]
    seen = {}
    for layer in [*layers, tied_head(model)]:
        problem = problem_of(layer) if layer is not None else None
        if problem is not None:
            seen[problem.key] = problem
    return sorted(seen.values(), key=lambda p: p.n * p.k, reverse=True)


def untuned(model, table: TuningTable | None = None) -> int:
    """(layer shape, row count) pairs of `model` this chip's table has no choice for yet."""
    table = table if table is not None else load_table()
    choices = table.choices if table is not None else {}
    rows = tuning_rows(current_chip()[0])
    return sum(1 for p in model_problems(model) for m in rows if str(m) not in choices.get(p.key, {}))
