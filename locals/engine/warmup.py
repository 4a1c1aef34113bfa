"""Compiles the decode step's shapes before a request needs them.

A whole decode step is one compiled graph per shape (rows in the step, slots of the decode
batch, token capacity; forward/compiled.py), and a graph traced while a request waits holds
every stream of that step. The shapes are few by construction (forward/kv.py's capacities,
forward.py's `step_rows`), so the engine traces them ahead: the likeliest before the server
says it is ready, the rest one at a time once no request has been around for a while. Each
shape runs through the real forward pass on placeholder rows (zeros in a throwaway decode
batch), so what is traced is exactly what a request would meet. See docs/arch/engine.md,
"Shapes".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from itertools import zip_longest

import mlx.core as mx

from locals.engine.forward import chunk_attention
from locals.engine.forward.compiled import seam_lengths
from locals.engine.forward.forward import RowInput, forward
from locals.engine.forward.kv import DecodeBatch, RowKV, row_capacity, token_capacity
from locals.engine.kernels import prebuild
from locals.engine.load.backend import release_memory

log = logging.getLogger(__name__)
# Agents' contexts: a 2-4k system prompt and turns to ~16k. Shapes of every slot count up to this
# capacity come before longer ones: with the fewest slots first and every capacity of each, one row
# at 24-49k came before 8 rows at 12k, and 8 agents at 8-12k tokens ran a third of their steps
# uncompiled on an H200 (docs/benchmarks-log.md, "Warm shapes in agents' order").
AGENTS_CONTEXT = 16384
# An idle trace holds a request that arrives meanwhile for as long as it runs, so one starts only
# after the engine has been idle at least as long as the last took, and this long at least.
# Traces of 2-5 s started between one agent's turns held its requests (TTFT p50 4.1 s against
# 0.3 s; docs/benchmarks-log.md, "A tuned table served, against none").
IDLE_QUIET_S = 0.5


def step_shapes(max_batch: int, max_positions: int, kv_positions: int) -> list[tuple[int, int, int]]:
    """(rows, slots, capacity) of whole decode steps: one row alone in 4 slots, or as many rows
    as slots (forward.py's `step_rows`; slots are powers of two from 4, kv.py), capacities up to
    `max_positions` (the model's context), batches of at most `kv_positions` (the KV budget: a
    batch traced ahead is allocated for a moment, never beside a live one). The likeliest first:
    capacities up to AGENTS_CONTEXT, the fewest slots first and every capacity of each, then the
    longer ones in the same order."""
    capacities = [token_capacity(1)]
    while capacities[-1] < max_positions:
        capacities.append(token_capacity(capacities[-1] + 1))
    slots = sorted({row_capacity(n) for n in range(1, max_batch + 1)})
    shapes = [(rows, n_slots, t_cap) for t_cap in capacities
              for rows, n_slots in [(1, 4)] + [(n, n) for n in slots] if n_slots * t_cap <= kv_positions]
    return sorted(shapes, key=lambda s: (s[2] > AGENTS_CONTEXT, s[1], s[0], s[2]))


class ShapeWarmer:
    """Traces one engine's short passes shape by shape, on the engine thread: whole decode steps
    (`step_shapes`) and the seams of passes up to `compile_max_tokens` tokens, interleaved so the
    likeliest of both come first. Until a shape is traced, passes of that shape run uncompiled
    (`CompiledBlocks.on_demand` off): slower, but nothing waits for a trace.

    On a GPU, before any of them and always before ready: the passes that run uncompiled at any
    shape — a prompt's first chunk read alone (`solo_chunk` tokens), a chunk after it and one
    far enough in for MLX's fused attention (forward/chunk_attention.py), and a chunk beside
    decoding batches; on CUDA also cuDNN's attention graphs for such chunks at every cache size of
    agents' contexts (45 ms each on an H200). They compile no graph, but on a GPU new to MLX each meets
    kernels MLX compiles on first use, tens of seconds each on an H200 (docs/arch/engine.md,
    "Shapes"); MLX keeps those on disk, so only a machine's first start pays them, and pays them
    here instead of in its first requests. A CPU compiles no kernels: it skips them. On CUDA the
    slowest of them, MLX's quantized-matmul tiles, are built by processes of their own from the
    moment the warmer exists (kernels/prebuild.py); the passes wait for those first."""

    def __init__(self, model, runner, max_batch: int, max_positions: int, kv_positions: int, chunk: int,
                 solo_chunk: int):
        self.model, self.runner = model, runner
        runner.compiled.on_demand = False
        shapes = step_shapes(max_batch, max_positions, kv_positions)
        lengths = seam_lengths(runner.choices.compile_max_tokens)  # forward._padded
        first_of = {}  # the smallest batches of 4 and 8 slots (as many rows), by their first shape
        for rows, slots, t_cap in shapes:
            if rows == slots < chunk and len(first_of) < 2:
                first_of.setdefault(slots, (rows, slots, t_cap))
        batches = list(first_of.values())
        self._uncompiled = [(self._trace_prefill, (solo_chunk, 0)), (self._trace_prefill, (chunk, solo_chunk)),
                            (self._trace_prefill, (solo_chunk, 2 * solo_chunk)),  # past chunk_attention's composed size
                            *((self._trace_step, (*batch, chunk - batch[0])) for batch in batches),
                            *([(self._build_chunk_attention, (chunk,))] if chunk_attention.ON_CUDA else [])
                            ] if compiles_kernels_on_first_use() else []
        self._prebuild = prebuild.start(model) if self._uncompiled else None
        # Keyed as CompiledBlocks.missed keys them: ("step", (rows, slots, t_cap)), ("seams", length).
        self._todo = _interleave((("step", s) for s in shapes), (("seams", n) for n in lengths))
        self._asked: set[tuple] = set()  # shapes traced because passes ran uncompiled at them
        self.traced = 0
        self.seconds = 0.0
        self.last_trace_s = 0.0
        self.done = False  # every shape compiled

    def warm(self, budget_s: float, stop=lambda: False) -> None:
        """Run the uncompiled passes (the first call only), then trace shapes until `budget_s` has
        passed or `stop()` (one shape at least), and log where that leaves it; `done` once none remain.
        The budget is the shapes' own: the kernel work before them (seconds on a warm machine,
        more as it grows) must not leave fewer shapes compiled before ready."""
        if self._prebuild is not None:
            self._prebuild.wait(stop=stop)
            self._prebuild = None
        while self._uncompiled and not stop():
            self._trace(*self._uncompiled.pop(0))
        start = time.perf_counter()
        while (job := self._next()) is not None:
            self._trace(*job)
            if time.perf_counter() - start >= budget_s or stop():
                if budget_s:
                    log.info("compiled %d decode-step shapes in %.1f s; the rest compile while idle",
                             self.traced, self.seconds)
                return
        self.done = True
        log.info("compiled every decode-step shape: %d in %.1f s", self.traced, self.seconds)

    def _next(self) -> tuple | None:
        """The next shape to trace: the one that ran uncompiled most often since the last trace
        (under steady traffic idle moments are few, so they go to what the traffic meets), else
        the next of the likeliest-first order; None once every shape is traced."""
        missed = self.runner.compiled.missed
        while missed:
            key = max(missed, key=missed.get)
            del missed[key]
            if key not in self._asked:
                self._asked.add(key)
                return self._job(key)
        return next((self._job(key) for key in self._todo if key not in self._asked), None)

    def _job(self, key: tuple) -> tuple:
        kind, shape = key
        return (self._trace_step, shape) if kind == "step" else (self._trace_seams, (shape,))

    def due(self, idle_for_s: float) -> bool:
        """Whether an idle trace may start after `idle_for_s` seconds without a request: shapes
        remain and the engine has been quiet at least as long as the last trace took (IDLE_QUIET_S
        at least). Between an agent's turns a trace of seconds would meet the next turn; a server
        left alone still compiles every shape."""
        return not self.done and idle_for_s >= max(IDLE_QUIET_S, self.last_trace_s)

    def _trace(self, trace, shape: tuple) -> None:
        began = time.perf_counter()
        self.runner.compiled.on_demand = True
        try:
            trace(*shape)
        finally:
            self.runner.compiled.on_demand = False
            # The placeholder batch is garbage now: give its memory back, or MLX's buffer
            # cache keeps a batch of every size traced.
            release_memory()
        took = time.perf_counter() - began
        self.traced, self.seconds, self.last_trace_s = self.traced + 1, self.seconds + took, took
        # Seconds a request arriving meanwhile would have waited: logged where they count.
        log.log(logging.INFO if took >= 0.5 else logging.DEBUG, "compiled %s %s in %.2f s",
                trace.__name__.removeprefix("_trace_"), shape, took)

    def _trace_step(self, rows: int, slots: int, t_cap: int, chunk: int = 0) -> None:
        """One decode step of `rows` placeholder rows in a batch of `slots` x `t_cap`, evaluated;
        with `chunk`, beside a prompt chunk of that many tokens (such a pass runs uncompiled)."""
        n_layers = len(self.model.model.layers)
        batch = DecodeBatch(n_layers)
        first = RowKV(n_layers, batch)
        self._run([RowInput(mx.zeros((2,), mx.int32), 2, first, False)])  # real K/V widths for the batch
        batch.join(first)
        batch.reserve(slots, t_cap)
        # Every layer reads and writes one placeholder array: the traced graph takes its shapes, not
        # its memory, and a batch of 36 layers at 16k positions is gigabytes to fill for nothing (on
        # CUDA, fresh unified memory at that).
        batch.kv[:] = [batch.kv[0]] * len(batch.kv)
        for slot in range(1, rows):
            row = RowKV(n_layers, batch)
            row.slot, row.length, row.layers = slot, 2, None
            batch.members.append(row)
        prompt = [RowInput(mx.zeros((chunk,), mx.int32), chunk, RowKV(n_layers), True)] if chunk else []
        self._run([RowInput(mx.zeros((1,), mx.int32), 1, row, True) for row in batch.members] + prompt)
        batch.members.clear()  # rows and batch refer to each other: free the arrays now, not at a GC
        batch.kv.clear()

    def _build_chunk_attention(self, chunk: int) -> None:
        """cuDNN's attention graphs for prompt chunks read beside decoding rows (up to `chunk` tokens,
        each bucket) at every cache size up to AGENTS_CONTEXT positions (forward/chunk_attention.py)."""
        layer = self.model.model.layers[0]
        attn = layer.self_attn
        chunk_attention.prebuild(attn.n_heads, attn.n_kv_heads, round(attn.scale ** -2),
                                 layer.input_layernorm.weight.dtype, chunk, AGENTS_CONTEXT)

    def _trace_seams(self, length: int) -> None:
        """A pass of `length` tokens (a prompt's last chunk, drafts, forced tokens) through the seams."""
        self._run([RowInput(mx.zeros((length,), mx.int32), length, RowKV(len(self.model.model.layers)), True)])

    def _trace_prefill(self, chunk: int, offset: int) -> None:
        """A prompt chunk of `chunk` tokens read after `offset` tokens of the same prompt."""
        kv = RowKV(len(self.model.model.layers))
        if offset:
            self._run([RowInput(mx.zeros((offset,), mx.int32), offset, kv, False)])
        self._run([RowInput(mx.zeros((chunk,), mx.int32), chunk, kv, True)])

    def _run(self, rows: list[RowInput]) -> None:
        mx.eval(forward(self.model, rows, self.runner.compiled, self.runner.choices))


def compiles_kernels_on_first_use() -> bool:
    """Whether MLX compiles kernels the first time a pass needs them here: on a GPU (CUDA's
    runtime compiler; Metal's library), not on the CPU."""
    return mx.default_device() == mx.gpu


def compile_stats(warmer: ShapeWarmer | None, compiled) -> dict:
    """Shapes compiled ahead so far, whether more are coming, and passes that ran uncompiled
    because theirs was not yet (0 once all are: what the served-traffic test checks)."""
    return {"compiled_shapes": warmer.traced if warmer else 0,
            "compile_seconds": round(warmer.seconds, 2) if warmer else 0.0,
            "compiling_ahead": bool(warmer) and not warmer.done,
            "uncompiled_passes": compiled.uncompiled_passes}


def _interleave(first: Iterator, second: Iterator) -> Iterator:
    """first[0], second[0], first[1], second[1], … then what is left of either."""
    for pair in zip_longest(first, second):
        yield from (item for item in pair if item is not None)
