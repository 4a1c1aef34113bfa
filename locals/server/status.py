"""The server's figures as JSON: `GET /health` (liveness + model), `GET /v1/locals/status`
(everything the dashboard and `locals status` show) and `GET /v1/locals/conversations`
(totals per client conversation, see callers.py).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict

import psutil
from aiohttp import web

from locals import __version__
from locals.server.state import ServerState, state_of

SERVICE = "locals"  # /health names itself so the daemon never mistakes another server for ours


def snapshot(state: ServerState) -> dict:
    """One JSON-able picture of the server; engine figures only once the model is loaded."""
    proc = psutil.Process(os.getpid())
    out = {"service": SERVICE, "version": __version__, "pid": os.getpid(),
           "status": "ready" if state.backend else ("failed" if state.load_error else "loading"),
           "model": state.model, "uptime_s": round(time.time() - state.started, 1),
           "memory_rss_bytes": proc.memory_info().rss, "error": state.load_error}
    backend = state.backend
    if backend is None:
        return out
    broken = backend.engine.broken
    if broken:
        out.update(status="failed", error=broken)
    activity = backend.activity
    stats = backend.stats()
    out.update(
        model=backend.name, model_id=backend.model_id, context_length=backend.context_length,
        engine=asdict(stats),
        requests={"total": activity.total, "in_flight": activity.in_flight,
                  "by_outcome": [{"api": api, "finish": finish, "count": n}
                                 for (api, finish), n in sorted(activity.requests.items())],
                  "mean_ttft_s": activity.ttft_sum / activity.ttft_count if activity.ttft_count else None,
                  "recent": [r.as_dict() for r in list(activity.recent)[:20]]})
    return out


async def health(request: web.Request) -> web.Response:
    state = state_of(request)
    broken = state.backend.engine.broken if state.backend else None
    ok = state.backend is not None and not broken  # a broken engine answers nothing: not healthy
    body = {"status": "ok" if ok else ("failed" if state.load_error or broken else "loading"),
            "service": SERVICE, "model": state.backend.name if state.backend else state.model,
            "pid": os.getpid(), "error": state.load_error or broken}
    return web.json_response(body, status=200 if ok else 503)


async def status(request: web.Request) -> web.Response:
    return web.json_response(snapshot(state_of(request)))


async def conversations(request: web.Request) -> web.Response:
    backend = state_of(request).backend
    rows = backend.activity.conversations.rows() if backend else []
    return web.json_response({"now": time.time(), "conversations": rows})


def register(app: web.Application) -> None:
    app.router.add_get("/health", health)
    app.router.add_get("/v1/locals/status", status)
    app.router.add_get("/v1/locals/conversations", conversations)
