"""The last minutes of the server's figures, one sample a second, so that a dashboard opened
now draws its charts with history: `GET /v1/locals/history[?since=T]`.

A task on the event loop takes each sample from `Engine.stats()` (counters the engine
thread updates; reading them never waits on that thread) and the activity's TTFTs of the
interval. It runs whether or not a page is open, and costs one stats read a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass

from aiohttp import web

from locals.errors import RequestError
from locals.server.state import STATE, ServerState, state_of

log = logging.getLogger(__name__)
INTERVAL_S = 1.0
KEEP_S = 600  # ten minutes


@dataclass
class Sample:
    """What the charts draw at one moment (speeds are the engine's 5 s rates)."""

    t: float
    decode_tps: float
    prefill_tps: float
    ttft_s: float | None  # mean TTFT of the requests whose first token came in this interval
    running: int  # in the engine's batch: decoding or reading their prompt
    waiting: int  # queued for a place in the batch
    in_flight: int  # HTTP requests being answered (these, and those still being prepared)
    kv_bytes: int
    kv_budget_bytes: int
    prefix_cache_bytes: int
    prompt_tokens_total: int
    cached_tokens_total: int


class History:
    """A ring of samples, oldest first."""

    def __init__(self, keep_s: float = KEEP_S, interval_s: float = INTERVAL_S):
        self.interval_s = interval_s
        self.samples: deque[Sample] = deque(maxlen=int(keep_s / interval_s))

    def take(self, state: ServerState, now: float | None = None) -> Sample | None:
        """Add a sample of `state` (nothing while the model loads) and return it."""
        backend = state.backend
        if backend is None:
            return None
        stats = backend.stats()
        ttfts = backend.activity.take_interval_ttfts()
        sample = Sample(
            t=round(time.time() if now is None else now, 3),
            decode_tps=round(stats.decode_tokens_per_s, 2), prefill_tps=round(stats.prefill_tokens_per_s, 2),
            ttft_s=round(sum(ttfts) / len(ttfts), 4) if ttfts else None,
            running=stats.running + stats.prefilling, waiting=stats.waiting, in_flight=backend.activity.in_flight,
            kv_bytes=stats.kv_bytes, kv_budget_bytes=stats.kv_budget_bytes,
            prefix_cache_bytes=int(stats.extra.get("prefix_cache_bytes", 0) or 0),
            prompt_tokens_total=stats.prompt_tokens_total, cached_tokens_total=stats.cached_tokens_total)
        self.samples.append(sample)
        return sample

    def since(self, t: float) -> list[dict]:
        return [dict(vars(s)) for s in self.samples if s.t > t]


HISTORY = web.AppKey("locals_history", History)


async def _sample_forever(state: ServerState, history: History) -> None:
    failed = False
    while True:
        try:
            history.take(state)
        except Exception:  # a bug here must not end the charts; said once, not every second
            if not failed:
                log.exception("the dashboard's history sampler failed; its charts miss samples")
            failed = True
        await asyncio.sleep(history.interval_s)


async def sampler(app: web.Application):
    """cleanup_ctx: the sampling task lives as long as the app."""
    task = asyncio.ensure_future(_sample_forever(app[STATE], app[HISTORY]))
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def history(request: web.Request) -> web.Response:
    raw = request.query.get("since", "0")
    try:
        since = float(raw)
    except ValueError:
        raise RequestError(f"`since` must be a number of seconds since the epoch, got {raw[:40]!r}") from None
    ring = request.app[HISTORY]
    return web.json_response({"interval_s": ring.interval_s, "now": time.time(),
                              "model": state_of(request).model, "samples": ring.since(since)})


def register(app: web.Application) -> None:
    app[HISTORY] = History()
    app.cleanup_ctx.append(sampler)
    app.router.add_get("/v1/locals/history", history)
