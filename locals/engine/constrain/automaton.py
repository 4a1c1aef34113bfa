"""Per-request TokenConstraint implementations: a JSON value, or tool calls in a model's format.

Both are driven by the engine thread only (contract.py). Every query is a dict
lookup plus at most one Index transition; masks are rows of a table already on the device.
Tool calls move through phases: FREE text (auto mode; no mask unless the text ends with
part of the start marker) -> HEAD (the frame up to the function name) -> CALL (that tool's
own automaton, entered once the name is unique; VALUE while inside a free-text value that
the call's runtime checks, holes.py) -> BETWEEN (another call or EOS) -> DONE.
With a token budget (`max_tokens`), the last tokens go to the shortest completion, so an
output cut off by its length limit still parses; `closed_by_budget` then says so.
"""

from __future__ import annotations

import copy
from enum import Enum

from locals.engine.constrain.contract import TokenConstraint
from locals.engine.constrain.holes import CallRuntime, Position
from locals.engine.constrain.index import CompiledIndex, DeviceRow, token_row
from locals.engine.constrain.tools import BLANKS, ToolSet, chosen_name

# Slack kept above the closing's length: one sampled token can lengthen the closing by a
# few tokens (it may open a string, an object and a key at once).
BUDGET_MARGIN = 8


class _Budget:
    """The token budget and, once it runs short, the closing being written."""

    def __init__(self, vocab, max_tokens: int | None):
        self.vocab = vocab
        self.left = max_tokens
        self.queue: list[int] | None = None

    def short(self, needed: int) -> bool:
        return self.left is not None and needed + BUDGET_MARGIN >= self.left

    def spend(self, token: int) -> None:
        if self.left is not None:
            self.left -= 1
        if self.queue:
            self.queue = self.queue[1:] if self.queue[0] == token else None

    def queue_mask(self):
        return DeviceRow(token_row(self.vocab, self.queue[:1])).get()

    def fork(self) -> _Budget:
        out = copy.copy(self)
        out.queue = list(self.queue) if self.queue is not None else None
        return out


class JsonConstraint(TokenConstraint):
    """Output is exactly one JSON value accepted by the compiled schema, then EOS."""

    def __init__(self, index: CompiledIndex, eos_only: DeviceRow, max_tokens: int | None = None):
        self._index = index
        self._state = index.initial
        self._eos_only = eos_only
        self._done = False
        self._budget = _Budget(index.vocab, max_tokens)
        self.closed_by_budget = False

    def _closing_queue(self) -> list[int] | None:
        budget = self._budget
        if budget.queue is None and not self._done and budget.left is not None:
            closing = self._index.closing(self._state)
            if closing and budget.short(len(closing)):
                budget.queue, self.closed_by_budget = closing, True
        return budget.queue

    def mask(self):
        if self._done:
            return self._eos_only.get()
        return self._budget.queue_mask() if self._closing_queue() else self._index.mask(self._state)

    def accept(self, token: int) -> None:
        if self._done:
            if token not in self._index.vocab.eos_ids:
                raise ValueError(f"token {token} after the end of the JSON value")
            return
        nxt = self._index.next_state(self._state, token)
        if nxt is None:
            raise ValueError(f"token {token} is not allowed by the JSON schema here")
        self._budget.spend(token)
        if token in self._index.vocab.eos_ids:
            self._done = True
        else:
            self._state = nxt

    def forced_tokens(self) -> list[int]:
        if self._done:
            return []
        return list(self._closing_queue() or self._index.forced(self._state))

    def closing_tokens(self) -> list[int]:
        return [] if self._done else self._index.closing(self._state)

    def is_complete(self) -> bool:
        return self._done or self._index.is_closed(self._state)

    def fork(self) -> JsonConstraint:
        """An independent copy to walk ahead with (checking a speculative draft)."""
        out = copy.copy(self)
        out._budget = self._budget.fork()
        return out


class Phase(Enum):
    FREE = "free"
    HEAD = "head"
    CALL = "call"
    VALUE = "value"
    BETWEEN = "between"
    DONE = "done"


class ToolCallConstraint(TokenConstraint):
    """Tool calls in the model's format: offered names only, arguments valid for their schema."""

    def __init__(self, tools: ToolSet, *, required: bool, max_calls: int | None = None,
                 max_tokens: int | None = None):
        self._tools = tools
        self._eos = tools.vocab.eos_ids
        self._max_calls = max_calls
        self._calls = 0
        self._marker_len = 0  # FREE: length of the marker prefix the text ends with
        self._window = True  # FREE: a call may still start here (always, unless the format is start-only)
        self._head_bytes = bytearray()
        self._index: CompiledIndex = tools.head  # HEAD: the head automaton and its state
        self._state = tools.head.initial
        self._run: CallRuntime | None = None  # CALL/VALUE: the chosen tool's automaton, position
        self._pos: Position | None = None
        self._phase = Phase.FREE
        self._budget = _Budget(tools.vocab, max_tokens)
        self.closed_by_budget = False
        if required:
            self._start_head(b"")

    @property
    def phase(self) -> Phase:
        return self._phase

    # -- TokenConstraint --

    def _free_row(self):
        """FREE phase: the DeviceRow that limits the next token, or None when any may come."""
        if not self._window:
            return None
        if self._no_room_for_a_call():
            return self._tools.guard_closed()[self._marker_len]
        return self._tools.guard()[self._marker_len]

    def mask(self):
        phase = self._phase
        if phase is Phase.FREE:
            row = self._free_row()
            return None if row is None else row.get()
        if phase is Phase.BETWEEN:
            return self._tools.eos_only.get() if self._no_room_for_a_call() else self._tools.between.get()
        if phase is Phase.DONE:
            return self._tools.eos_only.get()
        if self._closing_queue():
            return self._budget.queue_mask()
        return self._index.mask(self._state) if phase is Phase.HEAD else self._run.mask(self._pos)

    def writes_free_text(self) -> bool:
        return self._phase is Phase.FREE

    def unmasked(self) -> bool:
        """True while any token may come next (free text, no part of a call's marker pending):
        the engine may sample the next token before reading this one."""
        return self._phase is Phase.FREE and self._free_row() is None

    def accept(self, token: int) -> None:
        phase = self._phase
        if token in self._eos and phase in (Phase.FREE, Phase.BETWEEN, Phase.DONE):
            self._phase = Phase.DONE
        elif phase is Phase.FREE:
            self._accept_free(token)
        elif phase is Phase.BETWEEN:
            self._start_head(b"", token)
        elif phase is Phase.DONE:
            raise ValueError(f"token {token} after the last tool call")
        elif phase is Phase.HEAD:
            self._advance_head(token)
        else:
            self._advance_call(token)
        self._budget.spend(token)

    def forced_tokens(self) -> list[int]:
        if self._phase is Phase.HEAD:
            return list(self._closing_queue() or self._index.forced(self._state))
        if self._phase in (Phase.CALL, Phase.VALUE):
            return list(self._closing_queue() or self._run.forced(self._pos))
        return []

    def closing_tokens(self) -> list[int]:
        if self._phase in (Phase.CALL, Phase.VALUE):
            return self._run.closing(self._pos)
        if self._phase is Phase.HEAD:
            return self._tools.closing_from_head(bytes(self._head_bytes), self._state)
        return []

    def is_complete(self) -> bool:
        return self._phase is Phase.DONE

    def fork(self) -> ToolCallConstraint:
        """An independent copy to walk ahead with (checking a speculative draft)."""
        out = copy.copy(self)
        out._budget = self._budget.fork()
        out._head_bytes = bytearray(self._head_bytes)
        return out

    # -- budget --

    def _no_room_for_a_call(self) -> bool:
        return self._budget.left is not None and self._budget.short(self._tools.shortest_call())

    def _closing_queue(self) -> list[int] | None:
        budget = self._budget
        if budget.queue is None and budget.left is not None and budget.left <= self._tools.longest_call() * 4:
            closing = self.closing_tokens()
            # While the name is open, close as soon as some offered tool would not fit.
            needed = self._tools.longest_call() if self._phase is Phase.HEAD else len(closing)
            if closing and budget.short(needed):
                budget.queue, self.closed_by_budget = closing, True
        return budget.queue

    # -- phases --

    def _accept_free(self, token: int) -> None:
        fmt = self._tools.fmt
        if fmt.start_only and token in self._tools.reopen_ids:
            self._window, self._marker_len = True, 0
            return
        if not self._window:
            return
        marker = fmt.marker
        text = marker[: self._marker_len] + self._tools.vocab.bytes_of(token)
        at = text.find(marker)
        if at >= 0 and not (fmt.start_only and text[:at].strip(BLANKS)):
            self._start_head(text[at:])
            return
        self._marker_len = next((k for k in range(min(len(marker) - 1, len(text)), 0, -1)
                                 if text.endswith(marker[:k])), 0)
        # Start-only formats: the window stays open while the text is blanks, then part of the marker.
        if fmt.start_only and text[: len(text) - self._marker_len].strip(BLANKS):
            self._window, self._marker_len = False, 0

    def _start_head(self, data: bytes, token: int | None = None) -> None:
        head = self._tools.head
        state = head.next_state(head.initial, token) if token is not None else head.walk(head.initial, data)
        if state is None:
            raise ValueError("text not allowed at the start of a tool call")
        self._phase, self._index, self._state = Phase.HEAD, head, state
        self._head_bytes = bytearray(data if token is None else self._tools.vocab.bytes_of(token))
        self._maybe_enter_call()

    def _advance_head(self, token: int) -> None:
        nxt = self._index.next_state(self._state, token)
        if nxt is None or token in self._eos:
            raise ValueError(f"token {token} is not allowed in the tool call here")
        self._state = nxt
        self._head_bytes += self._tools.vocab.bytes_of(token)
        self._maybe_enter_call()

    def _advance_call(self, token: int) -> None:
        pos = None if token in self._eos else self._run.step(self._pos, token)
        if pos is None:
            raise ValueError(f"token {token} is not allowed in the tool call here")
        self._enter(pos)
        if self._run.is_closed(pos):
            self._calls += 1
            done = self._max_calls is not None and self._calls >= self._max_calls
            self._phase = Phase.DONE if done or self.closed_by_budget else Phase.BETWEEN
            self._budget.queue = None

    def _enter(self, pos: Position) -> None:
        self._pos, self._phase = pos, Phase.CALL if pos.hole is None else Phase.VALUE

    def _maybe_enter_call(self) -> None:
        name = chosen_name(self._tools, bytes(self._head_bytes))
        if name is None:
            return
        self._run = self._tools.call(name)
        state = self._run.index.walk(self._run.index.initial, bytes(self._head_bytes))
        if state is None:
            raise ValueError(f"the call frame of {name!r} does not continue its head")
        self._enter(self._run.settle(state))
