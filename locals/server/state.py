"""What the aiohttp application holds: the Backend once the model is loaded, and settings.

The server answers /health while the model loads; API routes get 503 until it is ready.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from aiohttp import web

from locals.server.backend import Backend


@dataclass
class ServerState:
    """Shared by all handlers; `backend` is None while the model loads (or if loading failed)."""

    model: str
    backend: Backend | None = None
    load_error: str | None = None
    started: float = field(default_factory=time.time)
    api_key: str | None = None
    allow_remote: bool = False
    max_body_mb: int = 32
    max_tokens: int | None = None  # cap on every reply, whatever the request asks
    overflow: str = "refuse"  # what a conversation past the context gets (locals/server/overflow.py)


STATE = web.AppKey("locals_state", ServerState)
STREAM_OPEN = web.RequestKey("locals_stream_open", web.StreamResponse)  # headers sent: errors go in the stream


def state_of(request: web.Request) -> ServerState:
    return request.app[STATE]


class NotReady(Exception):
    """The model is still loading (or failed to load): 503."""


def backend_of(request: web.Request) -> Backend:
    state = state_of(request)
    if state.backend is None:
        raise NotReady(state.load_error and f"the model failed to load: {state.load_error}"
                       or f"{state.model} is still loading; retry in a few seconds")
    return state.backend
