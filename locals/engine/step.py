"""Runs one scheduled step on the device and, later, turns its results into events.

`launch` builds the forward pass and the batch's sampling lazily and queues them
(`mx.async_eval`); `process` reads the tokens back and hands each to its sequence.
Between the two the engine may launch the next step, so the device never waits on Python.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import mlx.core as mx

from locals.engine.forward import RowInput, forward
from locals.engine.sampling import RowSampling, Sampled, sample
from locals.engine.scheduler import Slot
from locals.engine.sequence import Sequence
from locals.protocol import TokenLogprob


@dataclass
class Launched:
    """A step queued on the device whose tokens are not read yet."""

    slots: list[Slot]
    samplers: list[Sequence]
    sampled: Sampled | None
    prefill_tokens: int = 0  # prompt tokens this step reads
    started: float = field(default_factory=time.perf_counter)


def _row_sampling(seq: Sequence, mask) -> RowSampling:
    p = seq.request.sampling
    top = p.top_logprobs if p.logprobs else -1
    return RowSampling(p.temperature, p.top_p, p.top_k, p.min_p, seq.key, mask, top)


def _fail(seq: Sequence, exc: BaseException) -> None:
    seq.finish("error", f"{type(exc).__name__}: {exc}")


class StepRunner:
    """Launches and processes steps for one model."""

    def __init__(self, model, on_cache_point=None):
        self.model = model
        # Called as on_cache_point(seq, n_tokens) once the KV of a prompt prefix is built.
        self.on_cache_point = on_cache_point

    def launch(self, slots: list[Slot]) -> Launched | None:
        """Queue the forward pass and sampling for `slots`; None when no row is left."""
        masks = {}
        for slot in slots:
            if slot.sample and slot.seq.constraint is not None:
                try:
                    masks[slot.seq.id] = slot.seq.constraint.mask()
                except Exception as exc:  # a broken constraint fails its own request only
                    _fail(slot.seq, exc)
        slots = [s for s in slots if not s.seq.finished]
        if not slots:
            return None
        prefill_tokens = sum(s.n for s in slots if s.seq.prefilling)
        rows, before = [], {}
        for slot in slots:
            before[slot.seq.id] = slot.seq.kv.offset
            rows.append(RowInput(slot.seq.take_input(slot.n), slot.n, slot.seq.kv, slot.sample))
        logits = forward(self.model, rows)
        samplers = [s.seq for s in slots if s.sample]
        sampled = None
        if samplers:
            sampled = sample(logits, [_row_sampling(q, masks.get(q.id)) for q in samplers])
            for j, seq in enumerate(samplers):
                seq.lazy = sampled.tokens[j : j + 1]
                seq.key = sampled.keys[j]
                seq.sampled_steps += 1
                seq.inflight += 1
            mx.async_eval(sampled.arrays())
        else:
            mx.async_eval([a for r in rows for a in r.kv.arrays()])
        self._cache_points(slots, before)
        return Launched(slots, samplers, sampled, prefill_tokens)

    def _cache_points(self, slots: list[Slot], before: dict[str, int]) -> None:
        if self.on_cache_point is None:
            return
        for slot in slots:
            seq = slot.seq
            while seq.cache_points and seq.cache_points[0] <= seq.kv.offset:
                point = seq.cache_points.pop(0)
                if point > before[seq.id]:
                    self.on_cache_point(seq, point)

    def process(self, step: Launched) -> list[Sequence]:
        """Read the step's tokens and hand them to their sequences; returns those that got their first token."""
        if step.sampled is None:
            return []
        s = step.sampled
        tokens = s.tokens.tolist()
        logprobs = s.logprobs.tolist() if s.logprobs is not None else None
        top_ids = s.top_ids.tolist() if s.top_ids is not None else None
        top_lps = s.top_logprobs.tolist() if s.top_logprobs is not None else None
        first = []
        for j, seq in enumerate(step.samplers):
            seq.inflight -= 1
            if seq.finished:
                continue
            lp = None
            if logprobs is not None and seq.request.sampling.logprobs:
                k = seq.request.sampling.top_logprobs
                top = list(zip(top_ids[j][:k], top_lps[j][:k])) if top_ids is not None and k else []
                lp = TokenLogprob(tokens[j], logprobs[j], top)
            was_first = seq.first_token_at is None
            try:
                seq.on_sampled(tokens[j], lp)
            except Exception as exc:  # constraint / guard / stop logic of one request
                _fail(seq, exc)
            if was_first:
                first.append(seq)
        return first
