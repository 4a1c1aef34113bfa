"""Prompt-lookup drafts for speculative decoding: propose the tokens that followed the latest
earlier occurrence of the row's last n tokens (in its prompt or its output so far), and adapt
each row's draft length to how many of its drafts the model accepts.

Host-side only, no MLX: the step runner verifies drafts in its batched forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NGRAM_SIZES = (4, 3, 2)  # longest match first: a 4-token match predicts better than a 2-token one
# N-grams are keyed by a 64-bit polynomial hash (a lookup checks the tokens): numpy hashes a whole
# prompt at once. The index is built in the engine thread as a request is admitted, while every
# decoding row waits; tuples of tokens as keys, a Python loop a token, took 10 ms for a 10k-token
# prompt, hashed 2.6 (docs/benchmarks-log.md, "The prompt-lookup index, hashed by numpy").
_HASH_MUL = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1


class NgramIndex:
    """For each n-gram of a growing token list, the position right after its latest occurrence."""

    def __init__(self, sizes: tuple[int, ...] = NGRAM_SIZES):
        self.sizes = sizes
        self.tokens: list[int] = []
        self._after: dict[int, dict[int, int]] = {n: {} for n in sizes}  # size -> hash -> position

    def extend(self, tokens: list[int]) -> None:
        if len(tokens) > 64:  # a prompt, or a long forced run: hashed by numpy, all at once
            return self._extend_many(tokens)
        for token in tokens:
            j = len(self.tokens)
            # The n-grams ending at j-1 now have a known continuation: tokens[j].
            for n in self.sizes:
                if j >= n:
                    self._after[n][_hash(self.tokens[j - n : j])] = j
            self.tokens.append(token)

    def _extend_many(self, tokens: list[int]) -> None:
        before = len(self.tokens)
        self.tokens.extend(tokens)
        # Every n-gram that now has a continuation: those ending at positions before-1 .. len-2.
        offset = max(before - max(self.sizes), 0)
        arr = np.asarray(self.tokens[offset:], dtype=np.uint64)
        with np.errstate(over="ignore"):
            for n in self.sizes:
                if len(arr) <= n:
                    continue
                h = np.zeros(len(arr) - n, dtype=np.uint64)  # the n-gram starting at i, for i < len - n
                for i in range(n):
                    h = h * np.uint64(_HASH_MUL) + arr[i : len(arr) - n + i]
                after = np.arange(offset + n, offset + len(arr), dtype=np.int64)
                keep = after >= before  # continuations not indexed yet
                # Later positions come later in the zip: the latest occurrence wins, as in extend.
                self._after[n].update(zip(h[keep].tolist(), after[keep].tolist()))

    def propose(self, k: int) -> list[int]:
        """Up to `k` tokens that followed the longest n-gram the list ends with; [] when none did."""
        if k <= 0:
            return []
        for n in self.sizes:
            if len(self.tokens) < n:
                continue
            tail = self.tokens[-n:]
            at = self._after[n].get(_hash(tail))
            if at is not None and self.tokens[at - n : at] == tail:  # not a hash collision
                return self.tokens[at : at + k]
        return []

    def has_match(self) -> bool:
        return bool(self.propose(1))


def _hash(tokens: list[int]) -> int:
    """The n-gram's key: the same polynomial numpy computes in `_extend_many`, modulo 2^64."""
    h = 0
    for t in tokens:
        h = (h * _HASH_MUL + t) & _MASK
    return h


@dataclass
class DraftPolicy:
    """Engine-wide limits for prompt-lookup drafts."""

    max_draft: int  # most tokens proposed per row per step (EngineConfig.max_draft)
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
