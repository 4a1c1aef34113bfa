"""Contracts between the engine's step loop and the features that plug into it.

`TokenConstraint` is implemented by the constraint package (JSON-schema / tool-call
automata) and driven by the engine: every step the engine stacks the constrained
rows' masks into one (B, W) uint32 bitmask on the device and sets logits outside it
to -inf; sampled tokens are fed back with `accept`; tokens the automaton decides
alone are appended without running the sampler (jump-forward).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class TokenConstraint(Protocol):
    """Per-request automaton over token ids; one instance per request, used by the engine thread only."""

    def mask(self):
        """The allowed tokens now as a (W,) uint32 mx.array bitmask (bit i of word i//32),
        W = ceil(model vocab / 32), or None when every token is allowed (free text)."""

    def accept(self, token: int) -> None:
        """Advance past `token` (sampled or forced). Raises ValueError if it was not allowed."""

    def forced_tokens(self) -> list[int]:
        """Tokens the automaton decides alone from here (jump-forward); may be empty."""

    def closing_tokens(self) -> list[int]:
        """The shortest token sequence from here to a complete output (used when max_tokens runs out)."""

    def is_complete(self) -> bool:
        """True when the output is complete and generation must stop (finish reason "stop")."""

    # Optional: `fork()` -> an independent copy in the same state. Rows whose constraint
    # has it may speculate (drafts are walked on the copy); others never draft.
    # Optional: `unmasked()` -> True while any token may come next and none is forced (free
    # text). Such a row keeps pipelining: its next token is sampled before this one is read,
    # and dropped and drawn again, masked, if this one ended the free text.
