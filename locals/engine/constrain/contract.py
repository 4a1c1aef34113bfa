"""The contract between the engine's step loop and a request's constraint: `TokenConstraint`.

Implemented by this package (JSON-schema and tool-call automata, automaton.py) and driven by the
engine: every step the engine stacks the constrained rows' masks into one (B, W) uint32 bitmask
on the device and sets logits outside it to -inf; sampled tokens are fed back with `accept`;
tokens the automaton decides alone are appended without running the sampler (jump-forward).
Optional members have defaults here: an implementation subclasses `TokenConstraint` and
overrides what it has, and the engine calls every member without probing. No MLX here.
"""

from __future__ import annotations

from typing import Protocol


class TokenConstraint(Protocol):
    """Per-request automaton over token ids; one instance per request, used by the engine thread only."""

    # True once the automaton closed the output because max_tokens ran out: a complete output
    # then finishes "length", not "stop".
    closed_by_budget: bool = False

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

    def fork(self) -> TokenConstraint | None:
        """An independent copy in the same state, or None (the default) where there is none. Rows
        whose constraint forks may speculate (drafts are walked on the copy); others never draft."""
        return None

    def writes_free_text(self) -> bool:
        """True while the output is free text, even where some tokens are masked in it (the default
        False: all of it is held to the automaton). Stop strings are matched there only."""
        return False

    def unmasked(self) -> bool:
        """True while any token may come next and none is forced (free text); the default False.
        Such a row keeps pipelining: its next token is sampled before this one is read, and
        dropped and drawn again, masked, if this one ended the free text."""
        return False
