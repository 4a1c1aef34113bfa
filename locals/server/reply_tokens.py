"""Replies keep the tokens they were generated as.

A client sends the conversation back with the assistant's earlier replies as text, and the
server tokenizes the rendered prompt again. Text does not always come back as the tokens that
wrote it: the streamed text drops the space a reply's first token starts with (mlx-lm's
detokenizer trims it), and a model may spell a string in a way its encoder never would. The
prompt cache holds the tokens the model generated, so from the first token that differs the
reply and all after it are read again: 700-2,100 tokens an agent in the H200 benchmark's burst
(docs/benchmarks-log.md, "Replies keep their own tokens"). So the server remembers recent
replies' text with their tokens, and where a rendered prompt holds that exact text, those tokens
stand in for it: the prompt continues the cached tokens through the reply.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from locals.server.typed_controls import encode_spans

KEEP = 512  # replies remembered (a team of agents' last few turns each), least recently used out
MIN_CHARS = 16  # shorter replies are cheap to read again and too likely to occur elsewhere


class ReplyTokens:
    """Recent replies' text -> the tokens generated for it (used from the event loop and the
    threads that prepare requests)."""

    def __init__(self, keep: int = KEEP):
        self.keep = keep
        self._by_text: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, text: str, tokens: list[int], decode: Callable[[list[int]], str]) -> None:
        """Keep `tokens` for `text` when they write it: exactly, or with the space before the first
        word that the streamed text drops (mlx-lm's detokenizer trims it; the model wrote it, and the
        cache holds it). A trailing end-of-turn token the text does not show is dropped: the chat
        template writes its own."""
        if len(text) < MIN_CHARS:
            return
        tokens = next((cut for cut in (tokens, tokens[:-1]) if cut and decode(cut) in (text, " " + text)), None)
        if tokens is None:
            return
        with self._lock:
            self._by_text[text] = tuple(tokens)
            self._by_text.move_to_end(text)
            while len(self._by_text) > self.keep:
                self._by_text.popitem(last=False)

    def tokens(self, reply: str) -> tuple[int, ...] | None:
        """The tokens remembered for `reply`'s text, None when none are."""
        with self._lock:
            own = self._by_text.get(reply)
            if own:
                self._by_text.move_to_end(reply)
        return own
