"""How every benchmark of locals runs variants and summarises them: interleaved rounds (order
rotated each round, so drift hits every variant alike), medians with ranges, and a check that
the machine is quiet enough to time anything.

Used by the in-process decode benchmark (locals.engine.bench), the served-traffic benchmark
(locals.traffic) and the scripts in benchmarks/. No MLX here: servers are measured from a
process that never loads a model.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import psutil

BUSY_CPU_PERCENT = 25.0  # other processes' CPU use above which timings are not trustworthy


def summary(values: list[float]) -> dict:
    """Median and range of a list of measurements."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def interleaved(rounds: int, runners: dict[str, Callable[[], dict]], warmup: bool = True,
                on_sample: Callable[[str, int], None] | None = None) -> dict[str, list[dict]]:
    """Run each runner once per round, alternating (and rotating) their order; one untimed warm-up each."""
    if warmup:
        for fn in runners.values():
            fn()
    out: dict[str, list[dict]] = {name: [] for name in runners}
    names = list(runners)
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            out[name].append(runners[name]())
            if on_sample is not None:
                on_sample(name, r)
    return out


def other_cpu_percent(interval: float = 1.0) -> float:
    """CPU use of every other process over `interval` seconds, in percent of the whole machine."""
    me = psutil.Process()
    me.cpu_percent(None)
    total = psutil.cpu_percent(interval=interval)
    mine = me.cpu_percent(None) / (psutil.cpu_count() or 1)
    return max(total - mine, 0.0)
