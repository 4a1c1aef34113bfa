"""What other threads send the engine thread: the messages of `Engine`'s inbox, one dataclass each.

`Engine.submit`, `cancel` and `stop` put them; the engine thread takes them between steps, in
the order they came. No MLX here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from locals.protocol import Event, GenerationRequest

Sink = Callable[[Event], None]  # gets a request's events, on the engine thread


@dataclass(frozen=True)
class Submit:
    """A new request, where its events go, and when it arrived (time.perf_counter)."""

    request: GenerationRequest
    sink: Sink
    at: float


@dataclass(frozen=True)
class Cancel:
    """End the request with this id at the next step (waiting or running)."""

    request_id: str


@dataclass(frozen=True)
class Wake:
    """Nothing to do but look again: `stop` sends it to a thread waiting for work."""


Message = Submit | Cancel | Wake
