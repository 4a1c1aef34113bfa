"""The repetition guard: ends a request whose output has fallen into a loop.

A loop is the last `min_span` or more tokens repeating one period of 1..`max_period`
tokens at least `min_repeats` times. For each period p we keep how many tokens in a row
matched the token p places earlier, so each new token costs O(max_period) integer
comparisons. The defaults leave real code alone (indentation, closing braces, tables:
see tests/engine/test_guards.py) and stop degenerate output within a few hundred tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from locals.protocol import FinishReason, GenerationRequest

LOOP: FinishReason = "loop"


@dataclass(frozen=True)
class RepetitionSettings:
    """Thresholds of the repetition guard."""

    max_period: int = 64
    min_span: int = 200
    min_repeats: int = 4


class RepetitionGuard:
    """Watches one request's tokens; `on_token` returns "loop" once the output repeats."""

    def __init__(self, settings: RepetitionSettings = RepetitionSettings()):
        self.settings = settings
        self.history: list[int] = []
        # runs[p]: consecutive tokens equal to the token p places before them.
        self.runs = [0] * (settings.max_period + 1)

    def on_token(self, token: int, output: list[int] | None = None) -> FinishReason | None:
        h, s = self.history, self.settings
        h.append(token)
        n = len(h)
        for p in range(1, min(s.max_period, n - 1) + 1):
            if h[n - 1 - p] == token:
                self.runs[p] += 1
                span = self.runs[p] + p
                if span >= s.min_span and span >= s.min_repeats * p:
                    return LOOP
            else:
                self.runs[p] = 0
        return None


def repetition_guard_factory(settings: RepetitionSettings = RepetitionSettings()):
    """A GuardFactory for the engine: one RepetitionGuard per request.

    A request opts out with `request.meta["repetition_guard"] = False`.
    """

    def factory(request: GenerationRequest):
        if request.meta.get("repetition_guard") is False:
            return None
        return RepetitionGuard(settings)

    return factory
