"""Prompt-lookup drafts for speculative decoding: propose the tokens that followed the latest
earlier occurrence of the row's last n tokens (in its prompt or its output so far), and adapt
each row's draft length to how many of its drafts the model accepts.

Host-side only, no MLX: the step runner verifies drafts in its batched forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

NGRAM_SIZES = (4, 3, 2)  # longest match first: a 4-token match predicts better than a 2-token one


class NgramIndex:
    """For each n-gram of a growing token list, the position right after its latest occurrence."""

    def __init__(self, sizes: tuple[int, ...] = NGRAM_SIZES):
        self.sizes = sizes
        self.tokens: list[int] = []
        self._after: dict[tuple[int, ...], int] = {}

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            j = len(self.tokens)
            # The n-grams ending at j-1 now have a known continuation: tokens[j].
            for n in self.sizes:
                if j >= n:
                    self._after[tuple(self.tokens[j - n : j])] = j
            self.tokens.append(token)

    def propose(self, k: int) -> list[int]:
        """Up to `k` tokens that followed the longest n-gram the list ends with; [] when none did."""
        if k <= 0:
            return []
        for n in self.sizes:
            if len(self.tokens) < n:
                continue
            at = self._after.get(tuple(self.tokens[-n:]))
            if at is not None:
                return self.tokens[at : at + k]
        return []

    def has_match(self) -> bool:
        return bool(self.propose(1))


@dataclass
class DraftPolicy:
    """Engine-wide limits for prompt-lookup drafts."""

    max_draft: int = 8  # most tokens proposed per row per step
    start_draft: int = 4
    # Consecutive fully rejected drafts before a row pauses drafting, and the first pause
    # (in steps); each further pause doubles, up to max_pause.
    misses_before_pause: int = 2
    first_pause: int = 8
    max_pause: int = 256


class Speculation:
    """One row's draft state: its n-gram index, its current draft length, and its back-off."""

    def __init__(self, tokens: list[int], policy: DraftPolicy):
        self.policy = policy
        self.index = NgramIndex()
        self.index.extend(tokens)
        self.k = policy.start_draft
        self.misses = 0
        self.pause = 0  # steps left without drafting
        self.next_pause = policy.first_pause
        self.proposed = 0  # totals, for stats and tests
        self.accepted = 0

    def observe(self, tokens: list[int]) -> None:
        """Add tokens appended to the row (sampled, forced or accepted)."""
        self.index.extend(tokens)

    @property
    def wants_draft(self) -> bool:
        """Whether the next step should wait for this row's tokens to propose a draft."""
        return self.pause == 0 and self.index.has_match()

    def draft(self, limit: int) -> list[int]:
        if self.pause > 0:
            return []
        return self.index.propose(min(self.k, limit))

    def skipped_step(self) -> None:
        """A step ran without a draft for this row (its pause counts down)."""
        if self.pause > 0:
            self.pause -= 1

    def verified(self, proposed: int, accepted: int) -> None:
        """Adapt after a verified draft: longer after full acceptance, shorter after a miss,
        and a doubling pause after repeated misses so unrelated replies stop paying for drafts."""
        p = self.policy
        self.proposed += proposed
        self.accepted += accepted
        if accepted == proposed:
            self.k = min(self.k + 2, p.max_draft)
        else:
            self.k = max(accepted + 1, 1)
        self.misses = self.misses + 1 if accepted == 0 else 0
        if self.misses >= p.misses_before_pause:
            self.pause, self.misses = self.next_pause, 0
            self.next_pause = min(self.next_pause * 2, p.max_pause)
        elif accepted > 0:
            self.next_pause = p.first_pause
