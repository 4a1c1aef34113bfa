"""Counters and rates the engine thread updates and `Engine.stats()` reads."""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field

import mlx.core as mx

from locals.protocol import FinishReason

log = logging.getLogger("locals.engine.engine")
# A step this long held every stream in it: counted and logged with its shape, so a served run
# can be checked for waits on a kernel compiled on first use or a graph traced (docs/arch/engine.md,
# "Shapes").
SLOW_STEP_S = 2.0
# A gap between two step reads this long, and at least STALL_FACTOR times the typical gap, is one a
# decoding row sees as a stall (the served gap bar is 50 ms): counted with where the engine loop
# spent it, and logged. The factor keeps a CPU, where a step can take 100 ms by itself, from
# counting every step.
LONG_GAP_S = 0.1
STALL_FACTOR = 2.0


def reserved_bytes() -> int:
    """The memory MLX holds from the device: its live arrays and its buffer cache."""
    return mx.get_active_memory() + mx.get_cache_memory()


class RateMeter:
    """Tokens per second of the steps that ended in the last `window` seconds, each counted
    from when it started (a prompt read in one long step is not N tokens in no time)."""

    def __init__(self, window: float = 5.0):
        self.window = window
        self._events: deque[tuple[float, float, int]] = deque()  # (started, ended, tokens)

    def add(self, n: int, now: float | None = None, started: float | None = None) -> None:
        now = time.perf_counter() if now is None else now
        if n > 0:
            self._events.append((now if started is None else min(started, now), now, n))
        self._trim(now)

    def rate(self, now: float | None = None) -> float:
        now = time.perf_counter() if now is None else now
        self._trim(now)
        if not self._events:
            return 0.0
        span = max(now - min(started for started, _, _ in self._events), 1e-3)
        return sum(n for _, _, n in self._events) / span

    def _trim(self, now: float) -> None:
        while self._events and now - self._events[0][1] > self.window:
            self._events.popleft()


class StepIntervals:
    """The time between consecutive reads of engine steps — the gap a decoding row sees between
    its tokens — over the last `keep` steps, apart for steps that read prompt tokens (a mixed
    pass) and steps that only decode: what the served gap p99 is made of (docs/arch/engine.md)."""

    def __init__(self, keep: int = 4096):
        self._last: float | None = None
        self._kinds = {"decode": deque(maxlen=keep), "with_prompt": deque(maxlen=keep)}

    def waited(self) -> None:
        """The engine waited for work: the next read's interval is no gap a row saw."""
        self._last = None

    def add(self, now: float, prompt_tokens: int) -> float | None:
        """One step read at `now`: the gap since the read before (None after a wait for work)."""
        gap = None if self._last is None else now - self._last
        if gap is not None:
            self._kinds["with_prompt" if prompt_tokens else "decode"].append(gap)
        self._last = now
        return gap

    def summary(self) -> dict[str, dict[str, float]]:
        """Per kind: steps counted and their interval p50, p99 and max in ms."""
        out = {}
        for kind, values in self._kinds.items():
            ordered = sorted(values)
            if ordered:
                at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
                out[kind] = {"steps": len(ordered), "p50_ms": round(at(0.5) * 1e3, 1),
                             "p99_ms": round(at(0.99) * 1e3, 1), "max_ms": round(ordered[-1] * 1e3, 1)}
        return out


class GapClock:
    """Where the engine loop spent the time between two step reads, by phase (`mark` closes one:
    the disk tier's copy, admitting requests, building and queuing passes, reading a step, ending
    finished rows, tracing shapes ahead); a long gap (LONG_GAP_S or more and STALL_FACTOR times the
    typical one, a moving average) is counted, its phases added to the totals `summary` reports
    and logged with the step read at its end."""

    def __init__(self):
        self._since = time.perf_counter()
        self._phases: dict[str, float] = {}
        self.long_gaps = 0
        self._long_phases: dict[str, float] = {}
        self._typical: float | None = None  # moving average of the gaps
        self._device = [0, 0]  # this gap's queuing: bytes MLX took from the device, and gave back

    def mark(self, phase: str) -> None:
        """The time since the last mark was spent in `phase`."""
        now = time.perf_counter()
        self._phases[phase] = self._phases.get(phase, 0.0) + now - self._since
        self._since = now

    def queued(self, reserved_before: int) -> None:
        """MLX queued a pass, marked "queue"; `reserved_before`: `reserved_bytes()` when it began.
        What the queuing took from the device, or gave back, is added to this gap's: near MLX's
        limit an allocation that misses its buffer cache frees cached buffers and waits for the
        device, one cause of a long "queue" that this tells apart from others."""
        self.mark("queue")
        change = reserved_bytes() - reserved_before
        self._device[change < 0] += abs(change)

    def read(self, gap_s: float | None, rows: int, prompt_tokens: int) -> None:
        """A step was read (its reading marked as "read"); `gap_s` since the read before, None
        after a wait for work. Starts the next gap's phases."""
        self.mark("read")
        phases, self._phases = self._phases, {}
        (taken, given), self._device = self._device, [0, 0]
        if gap_s is None:
            return
        typical = gap_s if self._typical is None else self._typical
        self._typical = 0.95 * typical + 0.05 * gap_s
        if gap_s < max(LONG_GAP_S, STALL_FACTOR * typical):
            return
        self.long_gaps += 1
        for phase, took in phases.items():
            self._long_phases[phase] = self._long_phases.get(phase, 0.0) + took
        spent = ", ".join(f"{phase} {took * 1e3:.0f}" for phase, took in
                          sorted(phases.items(), key=lambda kv: -kv[1]) if took >= 0.001)
        log.info("long gap: %.0f ms between step reads (ms: %s; the step read: %d rows, %d prompt tokens; "
                 "MLX memory: %.1f GB active, %.1f GB cached; queuing took %.2f GB from the device, "
                 "gave back %.2f)", gap_s * 1e3, spent, rows, prompt_tokens, mx.get_active_memory() / 1e9,
                 mx.get_cache_memory() / 1e9, taken / 1e9, given / 1e9)

    def summary(self) -> dict:
        """Long gaps counted and the ms they spent in each phase, the largest first."""
        ms = {phase: round(took * 1e3, 1) for phase, took in sorted(self._long_phases.items(), key=lambda kv: -kv[1])}
        return {"count": self.long_gaps, "ms_by_phase": ms}


@dataclass
class Counters:
    """Totals since the engine started."""

    requests_total: int = 0
    requests_finished: int = 0
    prompt_tokens_total: int = 0
    generated_tokens_total: int = 0
    cached_tokens_total: int = 0
    steps: int = 0
    drafted_tokens_total: int = 0  # prompt-lookup draft tokens verified
    accepted_tokens_total: int = 0  # of those, kept
    taken_back_total: int = 0  # tokens constrained rows sampled ahead, then dropped for a masked draw
    masks_after_total: int = 0  # steps queued before their masked rows' tokens were read
    last_ttft_s: float = 0.0
    slow_steps: int = 0  # steps that took SLOW_STEP_S or more (each logged)
    slowest_step_s: float = 0.0
    finish_reasons: dict[FinishReason, int] = field(default_factory=dict)
    decode: RateMeter = field(default_factory=RateMeter)
    prefill: RateMeter = field(default_factory=RateMeter)
    intervals: StepIntervals = field(default_factory=StepIntervals)
    gaps: GapClock = field(default_factory=GapClock)

    def extra(self) -> dict:
        """What `Engine.stats()` reports of these counters in its `extra`."""
        return {"finish_reasons": dict(self.finish_reasons), "step_intervals": self.intervals.summary(),
                "long_gaps": self.gaps.summary(),
                "slow_steps": self.slow_steps, "slowest_step_s": round(self.slowest_step_s, 3),
                "drafted_tokens": self.drafted_tokens_total, "accepted_draft_tokens": self.accepted_tokens_total,
                "taken_back_tokens": self.taken_back_total, "masks_after_steps": self.masks_after_total}

    def note_step(self, took: float, step, uncompiled_passes: int) -> None:
        """Keep the slowest step's time; count and log a slow one (`step`: step.Launched, its rows
        and prompt tokens)."""
        self.slowest_step_s = max(self.slowest_step_s, took)
        if took >= SLOW_STEP_S:
            self.slow_steps += 1
            log.info("slow step: %.1f s (%d rows, %d prompt tokens; %d passes uncompiled so far)", took,
                     len(step.slots), step.prefill_tokens, uncompiled_passes)
