"""Builds each step from a token budget: every decoding row feeds its next token(s), then
prompts still being read take chunks of what is left of the budget, a budget that shrinks
while steps reading a prompt beside decoding rows run long (`MixedStepPacer`).

Two small managers, one job each; the scheduler only decides who feeds how many tokens,
it never touches MLX or the sequences' output.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from locals.engine.rows.sequence import Sequence


@dataclass
class Slot:
    """A row of the next forward pass: `n` input tokens of `seq`; `sample` after the last one."""

    seq: Sequence
    n: int
    sample: bool


class DecodeManager:
    """Rows past their prompt: each feeds its last token (plus any forced tokens) and samples."""

    def runnable(self, seq: Sequence) -> bool:
        return not seq.prefilling and seq.input_len > 0 and seq.can_sample_more

    def schedule(self, rows: list[Sequence]) -> list[Slot]:
        return [Slot(s, s.input_len, True) for s in rows if self.runnable(s)]


class PrefillManager:
    """Rows still reading their prompt, oldest first, in chunks that fit the budget left."""

    def __init__(self, min_chunk: int):
        self.min_chunk = min_chunk

    def runnable(self, seq: Sequence) -> bool:
        return seq.prefilling and seq.input_len > 0

    def schedule(self, rows: list[Sequence], budget: int) -> list[Slot]:
        budget = max(budget, self.min_chunk)
        slots = []
        for seq in rows:
            if budget <= 0:
                break
            if not self.runnable(seq):
                continue
            n = min(seq.input_len, budget)
            slots.append(Slot(seq, n, n == seq.input_len))
            budget -= n
        return slots


class MixedStepPacer:
    """Sizes the steps that read a prompt beside decoding rows by what they take, since a
    prompt token's cost grows with its context and differs by chip: such a step aims at
    `target_s` or twice a decode-only step, whichever is longer, so a decoding row waits about
    one extra step for its token, not the reading of 256 prompt tokens (seconds on a CPU at 8k
    tokens of context; docs/arch/engine.md, "Steps"). Its token budget halves after a mixed step
    that ran over and doubles back after one that took under half, in powers of two from `floor`
    to `ceiling`: passes keep a few shapes."""

    def __init__(self, ceiling: int, floor: int, target_s: float, recent: int = 31):
        self.budget = self.ceiling = ceiling
        self.floor = min(floor, ceiling)
        self.target_s = target_s
        self._decode = deque(maxlen=recent)  # the latest decode-only steps' seconds

    @property
    def decode_s(self) -> float:
        """A decode-only step's seconds, the median of the latest (a step that traced a graph
        or met a new kernel is an outlier, not the norm); 0 before any."""
        return sorted(self._decode)[len(self._decode) // 2] if self._decode else 0.0

    def budgets(self) -> list[int]:
        """Every token budget a mixed step may get, largest first."""
        out = [self.ceiling]
        while self.target_s > 0 and out[-1] // 2 >= self.floor:
            out.append(out[-1] // 2)
        return out

    def observe(self, seconds: float, prompt_tokens: int, decode_tokens: int) -> None:
        """One step read `seconds` after the one before it (back to back: no wait for work)."""
        if not prompt_tokens:
            self._decode.append(seconds)
            return
        if not decode_tokens or self.target_s <= 0:
            return  # a prompt read alone stalls no stream
        target = max(self.target_s, 2 * self.decode_s)
        if seconds > target:
            self.budget = max(self.floor, self.budget // 2)
        elif seconds < target / 2:
            self.budget = min(self.ceiling, self.budget * 2)


# With no row decoding, nobody's stream can stall: prompts are read in chunks this many
# times the budget (bigger matmuls, fewer steps; on GPUs 256-token chunks leave most of it idle).
SOLO_PREFILL_FACTOR = 8


class Scheduler:
    """Decode rows first (their streams must not stall), then prompt chunks with the rest."""

    def __init__(self, token_budget: int, min_prefill_chunk: int, solo_factor: int = SOLO_PREFILL_FACTOR,
                 mixed_step_s: float = 0.0):
        self.token_budget = token_budget
        self.solo_budget = token_budget * max(solo_factor, 1)
        self.decode = DecodeManager()
        self.prefill = PrefillManager(min_prefill_chunk)
        self.pacer = MixedStepPacer(token_budget, 2 * min_prefill_chunk, mixed_step_s)

    def next_step(self, rows: list[Sequence]) -> list[Slot]:
        decode = self.decode.schedule(rows)
        if not decode:
            return self.prefill.schedule(rows, self.solo_budget)
        used = sum(s.n for s in decode)
        return decode + self.prefill.schedule(rows, self.pacer.budget - used)
