"""The rows of one forward pass whose KV sits in the shared `DecodeBatch`, attended together.

Such a row brings one token (a decode step) or several (forced tokens after a constrained
draw, a draft to verify). All of them write their keys/values with one scatter and attend
in one call per layer: a pure decode step passes the queries as (rows, heads, 1, dim);
when some row brings several tokens, the queries are padded to the longest row's count
and masked causally. Rows reading a prompt keep their own caches (see forward.py). On the CPU
the attention's softmax runs in numpy (host_attention.py).
"""

from __future__ import annotations

from functools import lru_cache

import mlx.core as mx
import numpy as np

from locals.engine.forward import chunk_attention
from locals.engine.forward import host_attention as host


class BatchPlan:
    """Indices and mask for the batch's rows in this pass, built once and shared by all layers.

    `rows` are in slot order, their tokens contiguous in that order at the front of the
    pass's flat sequence (`tokens` of them). Rows that just finished their prompt join the
    batch here.
    """

    def __init__(self, rows: list):
        candidates = [r for r in rows if r.kv.batch is not None and (r.n == 1 or r.kv.resident)]
        self.batch = candidates[0].kv.batch if candidates else None
        self.rows: list = []
        self.tokens = 0
        if self.batch is None:
            return
        for r in candidates:
            # A row with no KV yet (a one-token prompt) reads it alone first and joins later;
            # so does one too long for the batch's padding (it keeps its own caches).
            if not r.kv.resident and r.kv.offset > 0 and self.batch.fits(r.kv.offset):
                self.batch.join(r.kv)
        self.rows = sorted((r for r in candidates if r.kv.resident), key=lambda r: r.kv.slot)
        if self.rows:
            self._shape()

    def _shape(self) -> None:
        # Indices and masks are built on the host: constants add no ops to the step's graph.
        batch = self.batch
        lengths = np.asarray([r.kv.length for r in self.rows], dtype=np.int32)
        counts = np.asarray([r.n for r in self.rows], dtype=np.int32)
        slots = [r.kv.slot for r in self.rows]
        self.tokens = int(counts.sum())
        self.t = int((lengths + counts).max())
        batch.reserve(len(batch.members), self.t)
        # Every member in the pass, in slot order (the usual case): plain slices, no gather.
        self.slots = None if slots == list(range(len(batch.members))) else mx.array(slots)
        # One scatter entry per new token's keys and one per its values: the row holding its
        # slot's keys (then values, rows_cap further) and its position (the row's length plus
        # the token's place among the row's new ones). All int32 (numpy's cumsum makes int64,
        # and MLX casts mixed index dtypes to a common one: two casts a scatter) and already
        # broadcast to (2 * tokens, kv_heads, 1) (three Broadcast ops fewer a scatter).
        starts = (np.cumsum(counts) - counts).astype(np.int32)
        within = np.arange(self.tokens, dtype=np.int32) - np.repeat(starts, counts)
        self._slots = np.asarray(slots, np.int32)
        self._index, self._token_places = None, (np.repeat(self._slots, counts), np.repeat(lengths, counts) + within)
        self.width = int(counts.max())
        if self.width == 1:
            self.gather = self.scatter = None
            # Positions past each row's new token are padding: masked where the lengths differ (the
            # mask is built when MLX's attention first asks for it). The decode attention kernel
            # (kernels/decode_attention.py) reads `meta` instead: each row's slot, then how many
            # keys it reads after this step's write.
            # `lengths`: each row's length before the pass, where its one new token goes (RoPE, the write).
            self.ragged, self.lengths = len(set(lengths.tolist())) > 1, lengths
            self._visible = self._mask = self._hidden = self._meta = None
            return
        # Query j of row i is the row's token min(j, n_i - 1): padding repeats the last one
        # (its output is dropped), so no query row is fully masked.
        last = np.minimum(np.arange(self.width)[None], counts[:, None] - 1)
        self.gather = mx.array((starts[:, None] + last).reshape(-1).astype(np.int32))
        self.scatter = mx.array((np.repeat(np.arange(len(counts)) * self.width, counts) + within).astype(np.int32))
        seen = lengths[:, None] + last  # the last position each query may attend to
        self.ragged, self._mask, self._hidden = True, None, None
        self._visible = (np.arange(self.t)[None, None] <= seen[:, :, None])[:, None]

    # Made when a pass first reads them: a whole step with placeholder rows makes its own
    # (`padded_step`), and on CUDA an array made from the host can cost ~1 ms while the device
    # runs (docs/benchmarks-log.md, "MLX's quantized-matmul tiles, built ahead").
    @property
    def index(self) -> tuple:
        """The scatter index of the pass's new keys, then values (`_scatter_index`)."""
        if self._index is None:
            self._index = _scatter_index(*self._token_places, self.batch.rows_cap, self.batch.kv_heads)
        return self._index

    @property
    def meta(self) -> mx.array:
        """Each row's slot, then how many keys it reads after this pass's write (one token a row)."""
        if self._meta is None:
            self._meta = mx.array(np.concatenate([self._slots, self.lengths + 1]))
        return self._meta

    def padded_step(self, rows: int) -> tuple[mx.array, tuple, mx.array] | None:
        """(positions, scatter index, meta) of a pure decode step with `rows` rows: the plan's, then
        rows in free slots at position 0 (their outputs dropped; a row joining later overwrites
        what they wrote), so the compiled step meets a few row counts only (forward.py's
        `_whole_step`). None when the batch has too few free slots."""
        pad, members = rows - len(self.rows), len(self.batch.members)
        if not pad:
            return mx.array(self.lengths), self.index, self.meta
        if members + pad > self.batch.rows_cap:
            return None
        slots = np.concatenate([self._slots, np.arange(members, members + pad, dtype=np.int32)])
        lengths = np.concatenate([self.lengths, np.zeros(pad, np.int32)])
        index = _scatter_index(slots, lengths, self.batch.rows_cap, self.batch.kv_heads)
        return mx.array(lengths), index, mx.array(np.concatenate([slots, lengths + 1]))

    @property
    def visible(self) -> np.ndarray | None:
        """Which of the batch's first `t` positions each query sees, (rows, 1, queries, t); None when
        all rows agree (built when an attention first asks for it)."""
        if self._visible is None and self.ragged:
            self._visible = (np.arange(self.t)[None] <= self.lengths[:, None])[:, None, None, :]
        return self._visible

    @property
    def mask(self) -> mx.array | None:
        """`visible` as MLX's attention takes it."""
        if self._mask is None and self.ragged:
            self._mask = mx.array(self.visible)
        return self._mask

    @property
    def hidden(self) -> np.ndarray | None:
        """Where `visible` is not, as the host's attention takes it."""
        if self._hidden is None and self.ragged:
            self._hidden = ~self.visible
        return self._hidden

    def attend(self, li: int, q: mx.array, kv: mx.array, scale: float, kernel=None) -> mx.array:
        """q (P, heads, 1, dim) and kv (2P, kv_heads, 1, dim) (keys, then values) of the plan's
        P tokens in order -> (P, heads * dim). `kernel`: a verified decode attention kernel,
        used when every row brings one token and the rows' lengths differ. At equal lengths MLX's
        own vector kernel runs (no mask), which was as fast or faster there (docs/benchmarks-log.md,
        "Rows at different lengths: decode attention over each row's own length")."""
        self.batch.write(li, self.index, kv)
        if kernel is not None and self.gather is None and self.ragged:
            return kernel(q, self.batch.kv[li], self.meta, self.t, scale)
        keys, values = self.batch.view(li, self.t, self.slots)
        if self.gather is None:
            o = self._attention(q, keys, values, scale)
            return o.reshape(o.shape[0], -1)
        rows, heads, dim = len(self.rows), q.shape[1], q.shape[3]
        padded = q[self.gather].reshape(rows, self.width, heads, dim).transpose(0, 2, 1, 3)
        o = self._attention(padded, keys, values, scale)
        o = o.transpose(0, 2, 1, 3).reshape(rows * self.width, heads * dim)
        return o[self.scatter]

    def _attention(self, q: mx.array, keys: mx.array, values: mx.array, scale: float) -> mx.array:
        if host.SOFTMAX_ON_HOST:
            return host.host_attention(q, keys, values, scale, hidden=self.hidden)
        # Rows bringing several tokens (drafts, forced tokens) would meet cuDNN, which builds a graph
        # for each new length t (40-100 ms while the rows wait): composed instead, as small prompt
        # chunks are (chunk_attention.py; docs/benchmarks-log.md, "Drafts and forced tokens on CUDA").
        if self.width > 1 and chunk_attention.composes(q.shape[0] * self.width, keys.shape[2]):
            return chunk_attention.composed_attention(q, keys, values, scale, self.mask)
        return mx.fast.scaled_dot_product_attention(q, keys, values, scale=scale, mask=self.mask)

    def advance(self) -> None:
        """Count the pass's tokens into each row's length (after the last layer wrote them)."""
        for r in self.rows:
            r.kv.length += r.n


def _scatter_index(slots: np.ndarray, positions: np.ndarray, rows_cap: int, kv_heads: int) -> tuple:
    """The scatter index of new tokens' keys then values: (slot row, head, position) arrays,
    each (2 * tokens, kv_heads, 1) int32."""
    n = 2 * len(slots)
    rows, places = (np.ascontiguousarray(np.broadcast_to(part[:, None, None], (n, kv_heads, 1)), dtype=np.int32)
                    for part in (np.concatenate([slots, slots + rows_cap]), np.concatenate([positions, positions])))
    return mx.array(rows), _heads_index(n, kv_heads), mx.array(places)


@lru_cache(maxsize=64)
def _heads_index(n: int, kv_heads: int) -> mx.array:
    """The heads part of a scatter index of `n` entries: the same for every pass of as many
    tokens, so made once, not from the host every pass."""
    return mx.array(np.ascontiguousarray(np.broadcast_to(np.arange(kv_heads, dtype=np.int32)[None, :, None],
                                                         (n, kv_heads, 1))))
