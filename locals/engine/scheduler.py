"""Builds each step from a token budget: every decoding row feeds its next token(s), then
prompts still being read take chunks of what is left of the budget.

Two small managers, one job each; the scheduler only decides who feeds how many tokens,
it never touches MLX or the sequences' output.
"""

from __future__ import annotations

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


class Scheduler:
    """Decode rows first (their streams must not stall), then prompt chunks with the rest; with
    no row decoding, nobody's stream can stall: prompts are read `solo_factor` budgets a step."""

    def __init__(self, token_budget: int, min_prefill_chunk: int, solo_factor: int = 1):
        self.token_budget = token_budget
        self.solo_budget = token_budget * max(solo_factor, 1)
        self.decode = DecodeManager()
        self.prefill = PrefillManager(min_prefill_chunk)

    def next_step(self, rows: list[Sequence]) -> list[Slot]:
        decode = self.decode.schedule(rows)
        if not decode:
            return self.prefill.schedule(rows, self.solo_budget)
        used = sum(s.n for s in decode)
        return decode + self.prefill.schedule(rows, self.token_budget - used)
