"""Stop strings over streamed text: emit what is safe, hold back what could start a stop string.

The stop text itself is never emitted; text after it is dropped. Text fed unwatched (a
constrained output: a tool call, a JSON reply) is streamed at once and never matched, so a stop
string never cuts an output that must parse (docs/serve.md, "APIs").
"""

from __future__ import annotations


class StopText:
    """Accumulates a request's decoded text and decides what may be streamed now."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.longest = max((len(s) for s in self.stops), default=0)
        self.text = ""
        self.emitted = 0
        self.watched_from = 0  # matches start here: text before it was fed unwatched
        self.hit = False
        self.matched: str | None = None  # the stop string that ended the text, once `hit`

    def feed(self, segment: str, watched: bool = True) -> str:
        """Add newly decoded text; return the text that can be streamed now.

        Sets `hit` when a stop string completed; the returned text then ends right before it.
        Unwatched text, and what was held back before it, is all streamed now.
        """
        self.text += segment
        if not watched:
            self.watched_from = len(self.text)
        if not self.stops or not watched:
            return self._emit_to(len(self.text))
        start = max(self.watched_from, self.emitted - self.longest + 1)
        found = [(i, s) for i, s in ((self.text.find(s, start), s) for s in self.stops) if i >= 0]
        if found:
            self.hit = True
            at, self.matched = min(found, key=lambda f: f[0])
            return self._emit_to(max(at, self.emitted))
        return self._emit_to(len(self.text) - self._held_back())

    def flush(self) -> str:
        """At the end without a stop match: the text still held back."""
        return "" if self.hit else self._emit_to(len(self.text))

    def _held_back(self) -> int:
        # The longest tail of the text that is a proper prefix of some stop string.
        tail = self.text[max(self.watched_from, len(self.text) - self.longest) :]
        for k in range(min(len(tail), self.longest - 1), 0, -1):
            if any(s.startswith(tail[-k:]) for s in self.stops):
                return k
        return 0

    def _emit_to(self, end: int) -> str:
        end = max(end, self.emitted)
        out = self.text[self.emitted : end]
        self.emitted = end
        return out
