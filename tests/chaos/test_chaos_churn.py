"""Churn (slow): 64 clients for `--churn-minutes` (10 by default) against a real daemon on
the embedded model, each looping over connect, stream, and hang up / read slowly / abandon
while queued (churn_clients.py). At the end nothing is running or queued, the KV in use is
back to its idle value, and the daemon's RSS under load in the last minute is within 10%
of its RSS under load in the minute after the first (medians: no leak). Prints requests
served, hang-ups, p99 time to first token and the memory drift.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from churn_clients import ChurnTally, client

CLIENTS = 64
SETTLE_S = 120  # for the requests still queued when the clients stop to be cancelled or end
RSS_EVERY_S = 5


def _busy(status: dict) -> int:
    engine = status["engine"]
    return engine["running"] + engine["waiting"] + engine["prefilling"] + status["requests"]["in_flight"]


async def _sample_rss(daemon, until: float, samples: list[tuple[float, int]]) -> None:
    start = time.monotonic()
    while time.monotonic() < until:
        status = await asyncio.to_thread(daemon.get_json, "/v1/locals/status")
        samples.append((time.monotonic() - start, status["memory_rss_bytes"]))
        await asyncio.sleep(RSS_EVERY_S)


async def _churn(daemon, minutes: float, tally: ChurnTally) -> list[tuple[float, int]]:
    """Run the clients; the daemon's RSS sampled meanwhile, as (seconds in, bytes)."""
    deadline = time.monotonic() + minutes * 60
    samples: list[tuple[float, int]] = []
    clients = [client(daemon.url, seed, deadline, tally) for seed in range(CLIENTS)]
    await asyncio.gather(_sample_rss(daemon, deadline, samples), *clients)
    return samples


def _median_rss(samples: list[tuple[float, int]], start: float, end: float) -> float:
    window = sorted(rss for at, rss in samples if start <= at < end)
    return window[len(window) // 2]


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.timeout(0)  # runs for --churn-minutes, plus the settling
def test_sixty_four_clients_churning_leave_nothing_behind(daemons, tmp_path, request):
    minutes = request.config.getoption("--churn-minutes", 10.0)
    daemon = daemons(tmp_path / "home")
    idle_kv = daemon.get_json("/v1/locals/status")["engine"]["kv_bytes"]
    tally = ChurnTally()
    samples = asyncio.run(_churn(daemon, minutes, tally))
    # Under load RSS swings with the batch (MLX keeps freed buffers for reuse): the median of
    # the minute after the first against the median of the last minute, both under load.
    warmup, total = min(60.0, minutes * 15), minutes * 60
    first_minute_rss = _median_rss(samples, warmup, 2 * warmup)
    loaded_rss = _median_rss(samples, total - warmup, total)
    settle_until = time.monotonic() + SETTLE_S
    status = daemon.get_json("/v1/locals/status")
    while _busy(status) and time.monotonic() < settle_until:
        time.sleep(1)
        status = daemon.get_json("/v1/locals/status")
    engine, idle_rss = status["engine"], status["memory_rss_bytes"]
    drift = loaded_rss / first_minute_rss - 1
    print(f"\nchurn: {CLIENTS} clients, {minutes:g} min: {tally.started} requests started, "
          f"{tally.served} served to the end, {tally.hangups} hang-ups, {tally.abandoned} abandoned "
          f"while queued, {len(tally.failures)} failures; TTFT p50 {tally.p(0.5):.2f} s, "
          f"p99 {tally.p(0.99):.2f} s; leaked slots {_busy(status)}; KV {engine['kv_bytes']} "
          f"(idle {idle_kv}); RSS median {first_minute_rss / 2**20:.0f} MiB in the minute after "
          f"the first, {loaded_rss / 2**20:.0f} MiB in the last ({drift:+.1%}), "
          f"{idle_rss / 2**20:.0f} MiB idle after")
    assert tally.failures == [], "\n".join(tally.failures[:20])
    assert tally.served and tally.hangups and tally.abandoned
    assert _busy(status) == 0
    assert engine["kv_bytes"] == idle_kv
    assert drift <= 0.10
