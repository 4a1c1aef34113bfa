"""Sampling for a whole batch on the device: constraint masks, temperature, top-k/top-p/min-p,
per-row PRNG keys, and log-probabilities (top-p's sort on the host on the CPU).

Each row carries its own key, split once per sampled token, so a seeded request draws
the same tokens whatever its batch mates are. Rows without a constraint mask or a
sampling setting add no work beyond what the batch needs for the rows that have one.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from locals.engine.constrain.apply import apply_bitmasks
from locals.engine.forward.rowfeed import RowOf, join_rows
from locals.engine.load.backend import detect

_split = mx.vmap(lambda key: mx.random.split(key))
# Temperatures at or below this draw greedily: they are greedy in effect, and 1e-45 (a denormal,
# flushed to zero) turned every logit into inf, so the draw returned token 0 (end-of-text garbage).
GREEDY_BELOW = 1e-4
# top-p sorts the batch's probabilities: on the CPU in numpy, 4x MLX's sort there (8 against 32 ms
# for 8 rows of 49,152; a top-p step 44 ms before: docs/benchmarks-log.md, "CPU: top-p's sort in numpy").
SORT_ON_HOST = detect().kind == "cpu"


@dataclass
class RowSampling:
    """What one row needs from the sampler this step."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    key: mx.array | RowOf  # (2,) uint32 PRNG key, or its row of the last step's keys
    mask: mx.array | None = None  # (W,) uint32 bitmask of allowed tokens, None = all
    top_logprobs: int = -1  # -1: no logprobs; 0: the chosen token's; k: also the top k
    # A drafted token to verify at this position (-1: none). Greedy rows ignore it (the
    # caller compares); sampled rows keep it with probability p(draft), else draw from p
    # without it, so the output distribution is exactly p (speculative rejection rule).
    draft: int = -1


@dataclass
class Sampled:
    """The batch's draws (lazy until evaluated), row order as given."""

    tokens: mx.array  # (S,) int32
    keys: mx.array  # (S, 2) next PRNG keys
    logprobs: mx.array | None = None  # (S,) logprob of each chosen token
    top_ids: mx.array | None = None  # (S, k) most likely tokens, best first
    top_logprobs: mx.array | None = None  # (S, k)

    def arrays(self) -> list[mx.array]:
        return [a for a in (self.tokens, self.keys, self.logprobs, self.top_ids, self.top_logprobs) if a is not None]


def apply_masks(logits: mx.array, masks: list[mx.array | None]) -> mx.array:
    """Set logits outside each row's bitmask (None: every token) to -inf, in one `where` over
    the stacked masks (constrain/apply.py)."""
    if all(m is None for m in masks):
        return logits
    width = (logits.shape[-1] + 31) // 32
    full = mx.full((width,), 0xFFFFFFFF, dtype=mx.uint32)
    # Runs of one same row (unmasked rows, rows in one automaton state) broadcast once.
    rows = [full if m is None else m if m.shape[0] == width else m[:width] for m in masks]
    return apply_bitmasks(logits, join_rows(rows, stack=True))


def sample(logits: mx.array, rows: list[RowSampling]) -> Sampled:
    """Draw one token per row from `logits` (S, vocab)."""
    if logits.dtype != mx.float32:
        logits = logits.astype(mx.float32)
    logits = apply_masks(logits, [r.mask for r in rows])
    greedy = mx.argmax(logits, axis=-1)
    # Rows whose keys are the last step's next keys, in order, take that array as it is.
    keys = join_rows([r.key for r in rows], stack=True)
    if all(r.temperature <= GREEDY_BELOW for r in rows):
        tokens = greedy  # greedy rows never use their key, so it stays as it is
    else:
        split = _split(keys)
        keys = split[:, 0]
        drawn = _draw(logits, rows, split[:, 1])
        is_greedy = mx.array([r.temperature <= GREEDY_BELOW for r in rows])
        tokens = mx.where(is_greedy, greedy, drawn)
    out = Sampled(tokens=tokens.astype(mx.int32), keys=keys)
    want = max(r.top_logprobs for r in rows)
    if want >= 0:
        _add_logprobs(out, logits, want)
    return out


def _draw(logits: mx.array, rows: list[RowSampling], keys: mx.array) -> mx.array:
    temps = mx.array([r.temperature if r.temperature > GREEDY_BELOW else 1.0 for r in rows])[:, None]
    scaled = logits / temps
    if any(r.top_k > 0 for r in rows):
        scaled = _top_k(scaled, [r.top_k for r in rows])
    if any(r.top_p < 1.0 for r in rows):
        scaled = _top_p(scaled, [r.top_p for r in rows])
    if any(r.min_p > 0.0 for r in rows):
        probs = mx.softmax(scaled, axis=-1)
        floor = mx.array([r.min_p for r in rows])[:, None] * probs.max(axis=-1, keepdims=True)
        scaled = mx.where(probs < floor, -mx.inf, scaled)
    # Gumbel-max: argmax(logits + Gumbel noise) is a draw from softmax(logits).
    noise = mx.vmap(lambda k: mx.random.gumbel(shape=(scaled.shape[-1],), key=k))(keys)
    if all(r.draft < 0 for r in rows):
        return mx.argmax(scaled + noise, axis=-1)
    return _verify_drafts(scaled, noise, rows, keys)


def _verify_drafts(scaled: mx.array, noise: mx.array, rows: list[RowSampling], keys: mx.array) -> mx.array:
    """Per row: keep its draft d with probability p(d), else draw from p with d removed."""
    drafts = mx.array([max(r.draft, 0) for r in rows])[:, None]
    has_draft = mx.array([r.draft >= 0 for r in rows])
    p_draft = mx.take_along_axis(mx.softmax(scaled, axis=-1), drafts, axis=-1)[:, 0]
    # A uniform draw per row from a key independent of the Gumbel noise's.
    u = mx.vmap(lambda k: mx.random.uniform(key=mx.random.split(k)[1]))(keys)
    is_draft = mx.arange(scaled.shape[-1])[None] == drafts
    residual = mx.argmax(mx.where(is_draft & has_draft[:, None], -mx.inf, scaled) + noise, axis=-1)
    kept = has_draft & (u < p_draft)
    return mx.where(kept, drafts[:, 0], residual)


def _top_k(scaled: mx.array, ks: list[int]) -> mx.array:
    vocab = scaled.shape[-1]
    ordered = mx.sort(scaled, axis=-1)  # ascending
    # The k-th largest value sits at index vocab - k; k = 0 keeps everything.
    idx = mx.array([vocab - k if 0 < k < vocab else 0 for k in ks])[:, None]
    kth = mx.take_along_axis(ordered, idx, axis=-1)
    return mx.where(scaled < kth, -mx.inf, scaled)


def _top_p(scaled: mx.array, ps: list[float]) -> mx.array:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (at least one)."""
    probs = mx.softmax(scaled, axis=-1)
    if SORT_ON_HOST:
        return mx.where(probs < mx.array(_host_floor(probs, ps)), -mx.inf, scaled)
    desc = -mx.sort(-probs, axis=-1)
    before = mx.cumsum(desc, axis=-1) - desc
    kept = before < mx.array(ps)[:, None]
    floor = mx.minimum(mx.min(mx.where(kept, desc, mx.inf), axis=-1, keepdims=True), desc[:, :1])
    return mx.where(probs < floor, -mx.inf, scaled)


def _host_floor(probs: mx.array, ps: list[float]) -> np.ndarray:
    """`_top_p`'s floor per row in numpy, the probabilities evaluated (the CPU's engine reads each
    step before the next anyway, forward/host_attention.py)."""
    desc = -np.sort(-np.asarray(probs.astype(mx.float32)), axis=-1)
    before = np.cumsum(desc, axis=-1) - desc
    kept = before < np.asarray(ps, np.float32)[:, None]
    return np.minimum(np.where(kept, desc, np.inf).min(axis=-1, keepdims=True), desc[:, :1]).astype(np.float32)


def _add_logprobs(out: Sampled, logits: mx.array, k: int) -> None:
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    out.logprobs = mx.take_along_axis(logprobs, out.tokens[:, None], axis=-1)[:, 0]
    if k > 0:
        top = mx.argpartition(-logprobs, kth=k - 1, axis=-1)[:, :k]
        vals = mx.take_along_axis(logprobs, top, axis=-1)
        order = mx.argsort(-vals, axis=-1)
        out.top_ids = mx.take_along_axis(top, order, axis=-1)
        out.top_logprobs = mx.take_along_axis(vals, order, axis=-1)
