"""The per-request guard hook: code that watches each new token and may end the request.

A `GuardFactory` is asked once per request for a `Guard` (or None); the engine calls the
guard's `on_token` with every sampled or forced token. Returning a finish reason (e.g.
"loop") ends the request with it; raising fails that request only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from locals.protocol import FinishReason, GenerationRequest


class Guard(Protocol):
    def on_token(self, token: int, output: list[int]) -> FinishReason | None:
        """`output` holds the request's tokens so far, `token` last. A finish reason ends it."""


GuardFactory = Callable[[GenerationRequest], Guard | None]


def make_guards(factories: list[GuardFactory], request: GenerationRequest) -> list[Guard]:
    """The guards that want to watch `request`."""
    return [g for g in (f(request) for f in factories) if g is not None]
