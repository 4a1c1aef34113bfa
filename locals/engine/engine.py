"""The engine: one thread owns MLX and runs the batch; everything else talks to it through
`submit` / `cancel` / `stats` (thread-safe) and the `stream` / `generate` adapters.

Each loop turn: take new requests and cancellations from the inbox, admit waiting
requests that fit (prefix-cache lookup first), launch the next step, then read back the
previous one (pipelined). Every request gets its TokenEvents and exactly one FinishEvent.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator

import mlx.core as mx

from locals.engine.load.backend import release_memory
from locals.engine.admission import ADMIT, WAIT, Admission, KVBudgetAdmission
from locals.engine.rows.guards import GuardFactory, make_guards
from locals.engine.forward.forward import CompiledBlocks, supports_ragged
from locals.engine.inbox import Cancel, Message, Sink, Submit, Wake
from locals.engine.forward.fuse import fuse_projections
from locals.engine.forward.kv import DecodeBatch, RowKV, kv_bytes_per_token
from locals.engine.rows.lookup import DraftPolicy
from locals.engine.cache.disk_cache import DiskPrefixStore
from locals.engine.cache.prefix_cache import PrefixCache
from locals.engine.scheduler import Scheduler
from locals.engine.rows.sequence import Sequence
from locals.engine.settings import EngineConfig
from locals.engine.cache.shared_prefill import SharedPrefill
from locals.engine.cache.tiered_cache import prefix_cache_of
from locals.engine.stats import Counters
from locals.engine.warmup import ShapeWarmer, compile_stats
from locals.engine.kernel_setup import fuse_kernels, patch_kernels
from locals.engine.step import Launched, StepRunner
from locals.protocol import EngineStats, Event, FinishEvent, FinishReason, GenerationRequest, Usage

log = logging.getLogger(__name__)
# How long stop() waits for pending disk writes (16k tokens of a 4B model: 2.4 GB); the rest is never half-written.
FLUSH_TIMEOUT_S = 60.0
# Unforced tokens in a row after which a constrained row is writing a value (`_masks_can_follow` may queue early).
FREE_RUN = 8
# A step reading this many prompt tokens or more times the engine's prefill for the prompt cache,
# which loads a prefix from disk only where that is quicker (tiered_cache.py); fewer tokens time
# the step's other work more than the reading.
PREFILL_SAMPLE_TOKENS = 128


def _safe(sink: Sink, request_id: str) -> Sink:
    """A sink whose failures (a consumer gone wrong) are logged, never raised into the engine."""

    def call(event: Event) -> None:
        try:
            sink(event)
        except Exception:
            log.exception("event sink of %s failed", request_id)

    return call


class Engine:
    """Continuous batching over one loaded model."""

    def __init__(self, loaded, config: EngineConfig | None = None, *,
                 prefix_cache: PrefixCache | None = None, disk_prefix: DiskPrefixStore | None = None,
                 admission: Admission | None = None, guards: list[GuardFactory] | tuple = ()):
        self.loaded = loaded
        self.model = loaded.model
        self.config = config or EngineConfig()
        # Before tuning: the tuned layers are the joined ones.
        self.fused_groups = fuse_projections(self.model) if self.config.fuse_projections else 0
        self.patched_layers, self.untuned_pairs = patch_kernels(loaded) if self.config.tuned_kernels else (0, 0)
        self.fused_kernel_layers = fuse_kernels(loaded) if self.config.tuned_kernels else {}
        self.tokenizer = loaded.tokenizer
        # Both budgets after the kernels: on CUDA their weight copies are memory the caches can't have.
        self.kv_budget = self.config.resolved_kv_budget()
        self.bytes_per_token = kv_bytes_per_token(self.model)
        if prefix_cache is None:
            prefix_cache = prefix_cache_of(self.config.resolved_prefix_cache_bytes(), disk_prefix)
        self.prefix_cache = prefix_cache
        self.admission = admission or KVBudgetAdmission(self.kv_budget, self.bytes_per_token)
        self.guard_factories = list(guards)
        cfg = self.config
        self.scheduler = Scheduler(cfg.step_token_budget, cfg.min_prefill_chunk, cfg.solo_prefill_factor)
        self.draft_policy = DraftPolicy(max_draft=cfg.max_draft) if cfg.speculate and cfg.max_draft > 0 else None
        self.runner = StepRunner(self.model, on_cache_point=self._insert_prefix,
                                 speculate_max_rows=cfg.speculate_max_rows, choices=cfg.forward)
        self.shared_prefill = SharedPrefill(self.prefix_cache, self._insert_prefix)
        # Decoding rows share one padded KV per layer (one attention call for all of them).
        # Slots from 4 only where steps compile (each slot count is a graph): on the CPU a new batch of
        # 4 slots for one row took ~95 ms to allocate and fill, a row's second token waiting on it
        # (docs/benchmarks-log.md, "CPU: a batch as small as its rows").
        least_slots = 4 if cfg.forward.compile_max_tokens else 1
        self.decode_batch = DecodeBatch(len(self.model.layers), least_slots) if supports_ragged(self.model) else None
        self.counters = Counters()
        self.runner.gaps = self.counters.gaps
        # Decode-step shapes compiled ahead (warmup.py); `ready` is set once the first batch of them is.
        # Traces run before ready or while idle, once the empty batch gave its arrays back (_loop):
        # a traced batch may take the whole KV budget.
        compiles_ahead = cfg.warm_up_s > 0 and cfg.forward.compile_max_tokens and self.decode_batch is not None
        self.warmer = (ShapeWarmer(self.model, self.runner, cfg.max_batch, loaded.context_length,
                                   self.kv_budget // max(self.bytes_per_token, 1),
                                   cfg.step_token_budget, self.scheduler.solo_budget) if compiles_ahead else None)
        self.ready = threading.Event()
        self._inbox: queue.Queue[Message] = queue.Queue()
        self._waiting: deque[tuple[GenerationRequest, Sink, float]] = deque()
        self._active: list[Sequence] = []
        self._thread: threading.Thread | None = None
        self.broken: str | None = None  # why the engine thread ended on its own (a bug); None while it runs
        self._submit_lock = threading.Lock()
        self._stopping = threading.Event()
        self._kv_bytes = 0
        self._pump = self.prefix_cache.pump  # a bounded slice of a disk tier's copy (nothing without one)

    # --- public surface -------------------------------------------------------------------

    def start(self) -> None:
        """Spawn the thread that owns MLX from now on."""
        if self._thread is not None:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="locals-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread; requests still running finish with reason "cancelled"."""
        if self._thread is None:
            return
        self._stopping.set()
        self._inbox.put(Wake())
        self._thread.join()
        self._thread = None
        # MLX objects left in reference cycles by the engine thread must go while MLX is
        # alive: collected during interpreter shutdown they abort the process (the thread
        # freed its compiled graphs itself, on its own stream).
        gc.collect()
        self._drain(block=False)
        self._end_all("cancelled", "engine stopped")
        written, abandoned = self.prefix_cache.flush(FLUSH_TIMEOUT_S)  # the disk tier's, where there is one
        if written or abandoned:
            log.info("prompt cache: %d disk write(s) finished at stop, %d abandoned", written, abandoned)

    def _end_all(self, reason: FinishReason, error: str) -> None:
        """Finish every running and waiting request with `reason` (the engine stops or broke)."""
        for seq in self._active:
            seq.finish(reason, error)
        for request, sink, _ in self._waiting:
            sink(FinishEvent(request.id, reason, Usage(len(request.prompt_tokens)), error))
        self._active.clear()
        self._waiting.clear()

    def submit(self, request: GenerationRequest, sink: Sink) -> None:
        """Queue `request`; `sink` gets its events on the engine thread (an error at once if the engine broke)."""
        with self._submit_lock:  # either queued before the engine broke (and answered), or answered here
            if not self.broken:
                self._inbox.put(Submit(request, _safe(sink, request.id), time.perf_counter()))
                return
        _safe(sink, request.id)(FinishEvent(request.id, "error", Usage(len(request.prompt_tokens)), self.broken))

    def cancel(self, request_id: str) -> None:
        """End a request at the next step (FinishEvent reason "cancelled"), freeing its slot and KV."""
        self._inbox.put(Cancel(request_id))

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Event]:
        """Events of `request` on the running asyncio loop; leaving early cancels it."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        self.submit(request, lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev))
        finished = False
        try:
            while not finished:
                event = await events.get()
                finished = isinstance(event, FinishEvent)
                yield event
        finally:
            if not finished:
                self.cancel(request.id)

    def generate(self, request: GenerationRequest) -> Iterator[Event]:
        """Events of `request`, blocking; closing the iterator early cancels it."""
        events: queue.Queue = queue.Queue()
        self.submit(request, events.put)
        finished = False
        try:
            while not finished:
                event = events.get()
                finished = isinstance(event, FinishEvent)
                yield event
        finally:
            if not finished:
                self.cancel(request.id)

    def _folded_in_matmuls(self) -> dict[str, int]:
        """Linears whose tuned kernel also does the add + norm after them or the MLP's activation (registry)."""
        if not self.patched_layers:
            return {}  # nothing tuned (a CPU): the kernel modules need not even be imported
        from locals.engine.kernels.registry import folded_counts

        return folded_counts(self.model)

    def stats(self) -> EngineStats:
        c = self.counters
        active = list(self._active)
        return EngineStats(
            model=getattr(self.loaded, "name", ""),
            running=sum(1 for s in active if not s.prefilling),
            waiting=len(self._waiting) + self._inbox.qsize(),
            prefilling=sum(1 for s in active if s.prefilling),
            requests_total=c.requests_total,
            requests_finished=c.requests_finished,
            prompt_tokens_total=c.prompt_tokens_total,
            generated_tokens_total=c.generated_tokens_total,
            cached_tokens_total=c.cached_tokens_total,
            decode_tokens_per_s=c.decode.rate(),
            prefill_tokens_per_s=c.prefill.rate(),
            last_ttft_s=c.last_ttft_s,
            kv_bytes=self._kv_bytes,
            kv_budget_bytes=self.kv_budget,
            weights_bytes=int(getattr(self.loaded, "weights_bytes", 0) or 0),
            steps=c.steps,
            extra={**c.extra(), "tuned_layers": self.patched_layers, "untuned_pairs": self.untuned_pairs,
                   **compile_stats(self.warmer, self.runner.compiled),
                   "generating_tokens": sum(len(s.generated) for s in active),  # not in the total yet
                   "fused_kernel_layers": self.fused_kernel_layers, "folded_in_matmuls": self._folded_in_matmuls(),
                   "prefix_cache_bytes": int(self.prefix_cache.nbytes),
                   "prefix_disk_hits": int(self.prefix_cache.disk_hits),
                   "prefix_disk_skipped": int(self.prefix_cache.disk_skipped),
                   "prefix_disk_writes": self.prefix_cache.disk_writes(),
                   "shared_prefill_waits": self.shared_prefill.waits},
        )

    # --- engine thread --------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # a bug: answer everyone and say so rather than leave them waiting
            log.exception("engine thread failed")
            with self._submit_lock:
                self.broken = f"the engine failed ({type(exc).__name__}: {exc}); restart locals (`locals stop`)"
            self._drain(block=False)
            self._end_all("error", self.broken)

    def _loop(self) -> None:
        # MLX streams belong to the thread that creates them: make ours here.
        with mx.stream(mx.new_stream(mx.default_device())):
            if self.warmer is not None:
                self.warmer.warm(self.config.warm_up_s, stop=self._stopping.is_set)
            self.ready.set()
            launched: Launched | None = None
            busy, idle_since = False, time.perf_counter()
            while not self._stopping.is_set():
                idle = launched is None and not self._active and not self._waiting
                if idle and busy:
                    # Once the last request is gone, give freed memory back so the server
                    # returns to its idle size between bursts of agents.
                    release_memory()
                    idle_since = time.perf_counter()
                busy = not idle
                if idle:
                    self.counters.intervals.waited()
                warming = idle and self.warmer is not None and self.warmer.due(time.perf_counter() - idle_since)
                gaps = self.counters.gaps
                if warming and self._inbox.empty():
                    self.warmer.warm(0.0)  # one shape: a request arriving now waits for one trace at most
                    gaps.mark("compiling ahead")
                # A bounded slice of the prompt cache's copy to host for disk (never a whole
                # prefix in one go: every running stream would stall on it).
                copying = self._pump is not None and self._pump(idle)
                gaps.mark("disk copy")
                self._drain(block=idle and not copying and not warming)
                gaps.mark("inbox")
                self._admit()
                gaps.mark("admit")
                waits = launched is not None
                masks, drafts = waits and self._sync_for_masks(), waits and self._sync_for_drafts()
                if masks and not drafts and self._masks_can_follow():
                    launched = self._launch_masked(launched)  # next pass queued, then masks
                    self._reap()
                    continue
                if masks or drafts:
                    self._process(launched)
                    launched = None
                slots = self.scheduler.next_step(self._active)
                new = self._launch(slots) if slots else None
                # Step n+1 is queued on the device; now read step n back.
                if launched is not None:
                    self._process(launched)
                launched = new
                if launched is not None and not self.config.pipeline:
                    self._process(launched)
                    launched = None
                self._reap()
            if launched is not None:
                self._process(launched)
            if self._pump is not None:
                self._pump(True, everything=True)  # every saved prefix to the disk writer; stop() waits
            # Leave no queued device work behind this thread (MLX aborts at exit otherwise).
            mx.synchronize()
            # Compiled graphs were traced on this thread's stream: free them on it.
            self.runner.compiled = CompiledBlocks()
            gc.collect()

    def _sync_for_masks(self) -> bool:
        """Whether a constrained row needs the token in flight before its next mask exists."""
        return any(s.needs_sync for s in self._active)

    def _masks_can_follow(self) -> bool:
        """Whether the next pass may be queued before the rows that need their token are read:
        each has sampled FREE_RUN tokens in a row that forced none (it is writing a value).
        A row that gets forced tokens meanwhile loses the queued draw, a whole step; among
        short values that happens on most tokens, and reading first was faster on the H200
        (1129 vs 980 tokens/s with 6 small tools, docs/benchmarks.md, constrained decoding)."""
        return self.config.pipeline_masks and all(
            s.sampled_since_forced >= FREE_RUN for s in self._active if s.needs_sync)

    def _sync_for_drafts(self) -> bool:
        """Whether a row wants to draft in a batch small enough to verify drafts (its token is read first)."""
        active = self._active
        if self.draft_policy is None or not any(s.wants_sync_for_draft for s in active):
            return False
        return sum(1 for s in active if not s.prefilling) <= self.config.speculate_max_rows

    def _launch_masked(self, step: Launched) -> Launched | None:
        """Queue the next forward pass, read `step`, then sample the pass with the masks its
        tokens give: the device runs the pass while Python reads and masks. A row whose draw
        in `step` will be taken back sits this step out (what it was fed is dropped)."""
        held = {v.seq.id for v in step.samplers if v.taken_back}
        slots = self.scheduler.next_step([s for s in self._active if s.id not in held])
        try:
            begun = self.runner.begin(slots, queue=True) if slots else None
        except Exception as exc:
            self._fail_step(slots, exc)
            begun = None
        self.counters.gaps.mark("build")
        self.counters.masks_after_total += begun is not None  # counted before `step` emits events
        self._process(step)
        if begun is None:
            return None
        try:
            launched = self.runner.finish(begun)
        except Exception as exc:
            self._fail_step(begun.slots, exc)
            return None
        finally:
            self.counters.gaps.mark("build")
        self.counters.steps += 1
        return launched

    def _drain(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=0.25) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, message: Message) -> None:
        if isinstance(message, Submit):
            self.counters.requests_total += 1
            self._waiting.append((message.request, message.sink, message.at))
        elif isinstance(message, Cancel):
            self._cancel(message.request_id)

    def _cancel(self, request_id: str) -> None:
        for seq in self._active:
            if seq.id == request_id:
                seq.finish("cancelled")
                return
        for entry in list(self._waiting):
            if entry[0].id == request_id:
                self._waiting.remove(entry)
                self._finish_waiting(entry, "cancelled")
                return

    def _finish_waiting(self, entry, reason: FinishReason, error: str | None = None) -> None:
        request, sink, _ = entry
        self.counters.requests_finished += 1
        self.counters.finish_reasons[reason] = self.counters.finish_reasons.get(reason, 0) + 1
        sink(FinishEvent(request.id, reason, Usage(len(request.prompt_tokens)), error))

    def _admit(self) -> None:
        held = []  # waiting for another row's prefill of their prefix; keep their places
        while self._waiting and len(self._active) < self.config.max_batch:
            request, sink, at = entry = self._waiting.popleft()
            if not request.prompt_tokens:
                self._finish_waiting(entry, "error", "empty prompt: at least one token is needed")
                continue
            if self.shared_prefill.hold(request, self._active):
                held.append(entry)
                continue
            verdict = self.admission.check(request)
            if verdict == WAIT:
                self._waiting.appendleft(entry)
                break
            if verdict != ADMIT:
                self._finish_waiting(entry, "memory", verdict)
                continue
            try:
                self._active.append(self._new_sequence(request, sink, at))
            except Exception as exc:  # this request's own fault or a bug: it alone fails
                log.exception("could not start request %s", request.id)
                self._finish_waiting(entry, "error", f"could not start the request: {exc}")
        self._waiting.extendleft(reversed(held))

    def _new_sequence(self, request: GenerationRequest, sink: Sink, at: float) -> Sequence:
        kv = RowKV(len(self.model.layers), self.decode_batch)
        seq = Sequence(request, sink, kv, self.tokenizer,
                       make_guards(self.guard_factories, request), at, self.draft_policy)
        n, stored = self.prefix_cache.lookup(seq.prompt)
        n = min(n, len(seq.prompt) - 1)  # the last prompt token must run to give logits
        if n > 0 and stored is not None:
            kv.load(stored, n)
            del seq.pending[:n]
            seq.cached_tokens = n
        kv.reserve(len(seq.prompt))  # the prompt's caches allocated once, not at every chunk
        self.counters.prompt_tokens_total += len(seq.prompt)
        self.counters.cached_tokens_total += seq.cached_tokens
        return seq

    def _launch(self, slots) -> Launched | None:
        try:
            step = self.runner.launch(slots)
        except Exception as exc:
            self._fail_step(slots, exc)
            return None
        finally:
            self.counters.gaps.mark("build")
        if step is not None:
            self.counters.steps += 1
        return step

    @staticmethod
    def _fail_step(slots, exc: Exception) -> None:
        """The whole pass failed: its rows' KV is no longer trustworthy."""
        log.exception("engine step failed")
        for slot in slots:
            slot.seq.finish("error", f"engine step failed: {exc}")

    def _process(self, step: Launched) -> None:
        try:
            if step.sampled is not None:  # the device's part of the read apart, for long gaps' phases
                mx.eval(step.sampled.tokens)
                self.counters.gaps.mark("device")
            first = self.runner.process(step)
        except Exception as exc:
            log.exception("reading an engine step failed")
            for slot in step.slots:
                slot.seq.finish("error", f"engine step failed: {exc}")
            return
        now = time.perf_counter()
        if step.prefill_tokens >= PREFILL_SAMPLE_TOKENS:  # how fast prompts are read, against disk loads
            self.prefix_cache.note_prefill(step.prefill_tokens, now - step.started)
        self.counters.note_step(now - step.started, step, self.runner.compiled.uncompiled_passes)
        self.counters.gaps.read(self.counters.intervals.add(now, step.prefill_tokens), len(step.slots),
                                step.prefill_tokens)
        self.counters.decode.add(step.emitted, now, step.started)
        self.counters.drafted_tokens_total += step.drafted
        self.counters.accepted_tokens_total += step.accepted
        self.counters.taken_back_total += step.taken_back
        self.counters.prefill.add(step.prefill_tokens, now, step.started)
        for seq in first:
            self.counters.last_ttft_s = seq.first_token_at - seq.submitted_at

    def _reap(self) -> None:
        done = [s for s in self._active if s.finished]
        if done:
            self._active = [s for s in self._active if not s.finished]
        for seq in done:
            self.admission.release(seq.request)
            c = self.counters
            c.requests_finished += 1
            c.generated_tokens_total += len(seq.generated)
            c.finish_reasons[seq.finish_reason] = c.finish_reasons.get(seq.finish_reason, 0) + 1
            if seq.kv.offset > 0 and seq.finish_reason in ("stop", "length", "cancelled"):
                kept = seq.prompt if seq.finish_reason == "cancelled" else seq.all_tokens()  # a retry resumes the read
                self._insert_prefix(seq, min(seq.kv.offset, len(kept)))
            seq.kv.release()
            seq.kv = None  # the KV goes as soon as no queued step needs it
        self._kv_bytes = sum(s.kv.nbytes for s in self._active)
        self.counters.gaps.mark("end rows")

    def _insert_prefix(self, seq: Sequence, n: int) -> None:
        try:
            self.prefix_cache.insert(seq.all_tokens()[:n], seq.kv.snapshot(n))
        except Exception:
            log.exception("prefix cache insert failed")
