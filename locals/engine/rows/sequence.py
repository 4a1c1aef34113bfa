"""One running request inside the engine: its inputs still to feed, its KV, its output so far,
and the rules that turn each new token into events (stop tokens, stop strings, constraint,
guards, max_tokens).

Owned by the engine thread. A `Sequence` never touches other sequences; an exception in
its own logic is caught by the engine and fails this request only.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import mlx.core as mx

from locals.engine.rows.guards import Guard
from locals.engine.forward.kv import RowKV
from locals.engine.rows.lookup import DraftPolicy, Speculation
from locals.engine.forward.rowfeed import RowOf
from locals.engine.rows.stops import StopText
from locals.engine.load.tokenizer import continuation_detokenizer
from locals.protocol import Event, FinishEvent, FinishReason, GenerationRequest, TokenEvent, TokenLogprob, Usage


class Sequence:
    """A request admitted into the batch."""

    def __init__(self, request: GenerationRequest, sink: Callable[[Event], None], kv: RowKV,
                 tokenizer, guards: list[Guard], submitted_at: float, draft_policy: DraftPolicy | None = None):
        self.request = request
        self.sink = sink
        self.kv = kv
        self.prompt = list(request.prompt_tokens)
        self.pending: list[int] = list(self.prompt)  # known tokens still to feed
        # Last sampled token, not read back yet, to feed first: its row of the step's tokens.
        self.lazy: RowOf | None = None
        self.generated: list[int] = []  # every sampled or forced token, stop tokens included
        self.sampled_steps = 0  # tokens sampled, including steps still in flight
        self.inflight = 0
        self.constraint = request.constraint
        # Masked tokens sampled in a row that forced no tokens after them (a long value being written).
        self.sampled_since_forced = 0
        self.guards = guards
        self.stop_ids = set(tokenizer.eos_token_ids) | set(request.sampling.stop_token_ids)
        # A raw prompt is continued: its first token's leading space is part of the text.
        self.detok = continuation_detokenizer(tokenizer) if request.meta.get("raw") else tokenizer.detokenizer
        self.stop_text = StopText(request.sampling.stop)
        self.cache_points = sorted(p for p in request.cache_points if 0 < p <= len(self.prompt))
        seed = request.sampling.seed
        # (2,) PRNG key, or its row of the last step's next keys (the batch feeds them back whole).
        # Any integer seeds (MLX's key takes 0..2^64 - 1; a client's -1 or 2^64 would raise).
        self.key: mx.array | RowOf = mx.random.key(seed % 2**64 if seed is not None else random.getrandbits(63))
        self.cached_tokens = 0
        self.submitted_at = submitted_at
        self.first_token_at: float | None = None
        self.finished = False
        self.finish_reason: FinishReason | None = None
        # Prompt-lookup drafts (None: this row never drafts); armed = wants its tokens read
        # before the next step so it can propose one.
        self.spec = Speculation(self.prompt, draft_policy) if draft_policy else None
        # Armed from the start: the first decode step waits for the first token and drafts.
        self.spec_armed = self.spec is not None

    @property
    def id(self) -> str:
        return self.request.id

    @property
    def prefilling(self) -> bool:
        return self.sampled_steps == 0

    @property
    def input_len(self) -> int:
        return len(self.pending) + (1 if self.lazy is not None else 0)

    @property
    def needs_sync(self) -> bool:
        """A constrained row needs its last token accepted before its next mask exists, unless
        it `runs_free`: then its next token is sampled before the last one is read."""
        return self.constraint is not None and self.inflight > 0 and not self.runs_free

    @property
    def runs_free(self) -> bool:
        """In free text (`in_free_text`) with nothing queued to feed: a token sampled ahead
        unmasked is then valid, unless the token before it ends the free text (`take_back`
        undoes it)."""
        return not self.pending and self.in_free_text

    @property
    def in_free_text(self) -> bool:
        """Whether the constraint lets any token come next (free text before a tool call)."""
        return self.constraint is not None and self.constraint.unmasked()

    def take_back(self, key) -> None:
        """Drop a token sampled ahead that needed a mask after all (the token before it started a
        tool call): the step fed this row that token, whose KV goes too; it is fed again, with
        the PRNG key the dropped draw used, so seeded output does not depend on timing."""
        fed = self.generated[-(len(self.pending) + 1)]  # forced tokens may follow it in `pending`
        self.kv.trim(1)
        self.pending.insert(0, fed)
        self.lazy, self.key = None, key
        self.sampled_steps -= 1

    @property
    def wants_sync_for_draft(self) -> bool:
        """A drafting row needs its last token known before it can look up a draft."""
        return self.spec_armed and self.inflight > 0

    @property
    def can_sample_more(self) -> bool:
        return self.sampled_steps < self.request.sampling.max_tokens

    def take_input(self, n: int) -> mx.array | RowOf:
        """The next `n` input tokens, removed from what is left to feed: a lazy (n,) int32
        array, or the last step's row itself when that one token is all (fed without a slice)."""
        if self.lazy is not None and n == 1:
            lazy, self.lazy = self.lazy, None
            return lazy
        parts = []
        if self.lazy is not None:
            parts.append(self.lazy.take())
            self.lazy = None
            n -= 1
        if n > 0:
            parts.append(mx.array(self.pending[:n], dtype=mx.int32))
            del self.pending[:n]
        return mx.concatenate(parts) if len(parts) > 1 else parts[0]

    def after_step(self, drafted: int, accepted: int) -> None:
        """Update the draft state once a step's tokens are handed over."""
        spec = self.spec
        if spec is None:
            return
        spec.observe(self.generated[len(spec.index.tokens) - len(self.prompt):])
        if drafted:
            spec.verified(drafted, accepted)
        else:
            spec.skipped_step()
        self.spec_armed = spec.wants_draft

    def usage(self) -> Usage:
        return Usage(len(self.prompt), len(self.generated), self.cached_tokens)

    def all_tokens(self) -> list[int]:
        return self.prompt + self.generated

    # --- turning new tokens into events -------------------------------------------------

    def on_sampled(self, token: int, logprob: TokenLogprob | None) -> None:
        """Handle one sampled token: emit its text, finish when a stop rule says so."""
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        self.generated.append(token)
        if token in self.stop_ids:
            return self._finish_text("stop")
        if self.constraint is not None:
            self.constraint.accept(token)
        if self._append(token, logprob, forced=False):
            return
        if self.constraint is not None:
            self._after_constraint_step()

    def _append(self, token: int, logprob: TokenLogprob | None, forced: bool) -> bool:
        """Emit `token`'s text; True when the sequence finished because of it."""
        for guard in self.guards:
            reason = guard.on_token(token, self.generated)
            if reason:
                if self.constraint is not None:
                    # Stopped inside a constrained output (a tool call, a JSON reply): keep the token
                    # the constraint took and close what is open, so the output still parses.
                    self._emit(token, logprob, forced)
                    self._append_closing(self.constraint.closing_tokens())
                self._finish_text(reason)
                return True
        self._emit(token, logprob, forced)
        if self.stop_text.hit:
            self.finish("stop")
            return True
        if len(self.generated) >= self.request.sampling.max_tokens:
            self._finish_text("length")
            return True
        return False

    def _emit(self, token: int, logprob: TokenLogprob | None, forced: bool, closing: bool = False) -> None:
        # The ending is forced two ways: appended whole here (`_append_closing`), or token by
        # token by the constraint itself once the budget runs short (`closed_by_budget`).
        closing = closing or (self.constraint is not None and self.constraint.closed_by_budget)
        self.detok.add_token(token)
        text = self.stop_text.feed(self.detok.last_segment, self._stops_watch)
        self.sink(TokenEvent(self.id, [token], text, [logprob] if logprob else None, forced, closing))

    @property
    def _stops_watch(self) -> bool:
        """Stop strings end free text only: a constrained output (a tool call, a JSON reply) runs
        to its end, so it parses. The token that opens a tool call is read after the constraint
        took it, so the opening markup is not watched either. Free text stays watched where the
        automaton masks some tokens in it (no room left for a call, a marker begun)."""
        return self.constraint is None or self.constraint.writes_free_text()

    def _append_closing(self, closing: list[int]) -> None:
        """The constraint's shortest way to a complete output, appended as forced tokens."""
        for token in closing:
            self.generated.append(token)
            self.constraint.accept(token)
            self._emit(token, None, True, closing=True)

    def _after_constraint_step(self) -> None:
        c = self.constraint
        if c.is_complete():
            return self._finish_text(self._complete_reason())
        forced = c.forced_tokens()
        # Free text before a call is not a masked run.
        self.sampled_since_forced = 0 if forced or self.in_free_text else self.sampled_since_forced + 1
        for token in forced:
            if self._room_left_for_closing():
                return
            self.generated.append(token)
            c.accept(token)
            self.pending.append(token)
            if self._append(token, None, forced=True):
                return
            if c.is_complete():
                return self._finish_text(self._complete_reason())
        self._room_left_for_closing()

    def _complete_reason(self) -> FinishReason:
        """A complete output is a "stop", unless the constraint closed it because the budget ran out."""
        return "length" if self.constraint.closed_by_budget else "stop"

    def _room_left_for_closing(self) -> bool:
        """When only the closing tokens still fit in max_tokens, append them and finish "length"."""
        closing = self.constraint.closing_tokens()
        remaining = self.request.sampling.max_tokens - len(self.generated)
        if not closing or remaining > len(closing):
            return False
        self._append_closing(closing)
        self._finish_text("length")
        return True

    def _finish_text(self, reason: FinishReason) -> None:
        self.detok.finalize()
        tail = self.stop_text.feed(self.detok.last_segment, self._stops_watch) if not self.stop_text.hit else ""
        tail += self.stop_text.flush()
        if tail:
            self.sink(TokenEvent(self.id, [], tail))
        self.finish(reason)

    def finish(self, reason: FinishReason, error: str | None = None) -> None:
        """Send the one FinishEvent; later calls do nothing."""
        if self.finished:
            return
        self.finished = True
        self.finish_reason = reason
        detail = {"stop_sequence": self.stop_text.matched} if self.stop_text.matched else {}
        self.sink(FinishEvent(self.id, reason, self.usage(), error, detail))
