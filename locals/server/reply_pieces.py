"""One reply's text, as the engine streams it, cut into what the APIs hand on: a thinking
model's reasoning (thinking.py), the answer's text and its tool calls (toolcalls.py), less the
calls that a reply's forced ending cut off. `backend.Backend.run` feeds it the engine's events.
"""

from __future__ import annotations

import logging

from locals.protocol import TokenEvent
from locals.server.thinking import Thinking, ThinkingSplitter
from locals.server.toolcalls import ToolCall, ToolCallSplitter

log = logging.getLogger(__name__)
Piece = str | Thinking | ToolCall  # answer text, reasoning, a whole call


class ReplyPieces:
    """One reply's text as the APIs hand it on: a thinking model's reasoning (Thinking), the
    answer's text and its tool calls, less the calls its forced ending cut off (CutCalls)."""

    def __init__(self, splitter: ToolCallSplitter, thinking: ThinkingSplitter | None):
        self.splitter, self.thinking, self.cut = splitter, thinking, CutCalls()

    @property
    def calls(self) -> int:
        return len(self.splitter.calls) - len(self.cut.names)

    def feed(self, event: TokenEvent) -> list[Piece]:
        self.cut.closing = self.cut.closing or event.closing
        return self._split(self.thinking.feed(event.text) if self.thinking else [event.text])

    def finish(self) -> list[Piece]:
        out = self._split(self.thinking.finish() if self.thinking else [])
        return out + self.cut.kept(self.splitter.finish())

    def _split(self, texts: list) -> list[Piece]:
        out: list[Piece] = []
        for text in texts:
            if isinstance(text, Thinking):
                out.append(text)
            else:
                out += self.cut.kept(self.splitter.feed(text))
        return out


class CutCalls:
    """Holds back the tool calls a reply's forced ending completed. When `max_tokens` or a
    guard ends a reply inside a call, the constraint closes it so the text parses, but its
    arguments are cut short: a command cut at `rm -rf /home` or a file cut mid-way would run
    as if whole. Such a call is dropped (as a cut-off call is unusable from OpenAI or Anthropic);
    the finish reason says why and `locals.cut_tool_call` names it."""

    def __init__(self):
        self.closing = False  # set once the engine sent the first token of the forced ending
        self.names: list[str] = []

    def kept(self, pieces) -> list:
        out = []
        for piece in pieces:
            if self.closing and isinstance(piece, ToolCall):
                self.names.append(piece.name)
            else:
                out.append(piece)
        return out

    def last(self, api: str, request_id: str) -> str | None:
        if not self.names:
            return None
        log.warning("%s request %s: the reply ended inside a call to %s (max_tokens or a guard); the cut-off "
                    "call was not returned", api, request_id, self.names[-1])
        return self.names[-1]
