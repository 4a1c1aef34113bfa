"""Per-sequence KV storage: an mlx-lm `KVCache` per layer while a prompt is read, then a slot
of the shared `DecodeBatch` once the sequence decodes, so decode attention is one call per layer.

A prompt's KV follows its own length (no padding while reading long prompts); decoding rows
sit in one padded array per layer (each slot's keys and values: 2 × rows, kv_heads, T,
head_dim) with per-row lengths.
Finishing a sequence frees its caches or its slot.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from locals.engine.load.backend import detect

# A prefix's KV as stored by the prefix cache: per layer (keys, values), each
# (1, kv_heads, n_tokens, head_dim).
LayerKV = tuple[mx.array, mx.array]

T_STEP = 256  # the decode batch grows its token axis in blocks of this many positions
# A row joins the decode batch only while the padded batch stays within this factor of its
# rows' own KV (plus one block each): a long row among short ones decodes on its own caches.
MAX_PADDING = 2
ROOM_STEP = 1024  # a prompt's own caches are sized in multiples of this many positions (PromptKV)

# Copies out of a row's K/V are evaluated at once on the CPU. There a copy only queued still held
# the buffers it read when the next write into them ran, so MLX copied the whole array it wrote
# (every layer's, in the step after a request ended: docs/benchmarks-log.md, "A row leaving the
# decode batch"), and nothing overlaps there anyway (the engine reads each step as it queues it).
# On a GPU they stay queued, so the pass in flight goes on: on CUDA a queued read of the cache
# did not make the next write copy it (docs/benchmarks-log.md, "Kernels of one engine step").
SETTLE_COPIES = detect().kind == "cpu"


def settle(arrays: list) -> None:
    """Evaluate `arrays` (copies out of K/V buffers) now where SETTLE_COPIES, else queue them."""
    if SETTLE_COPIES:
        mx.eval(arrays)
    else:
        mx.async_eval(arrays)


class PromptKV(KVCache):
    """mlx-lm's `KVCache` that takes room for `room` positions at once when it must grow.

    KVCache grows by 256 positions, copying what it holds: a prompt read in chunks of ~250 tokens
    beside decoding rows (the step budget less the rows) grew, and copied, its caches into new
    buffers of a new size at nearly every chunk, in the steps where served gaps were longest
    (docs/benchmarks-log.md, "Where the served gaps go")."""

    room = 0  # positions to allocate when growing (the sequence's prompt, `RowKV.reserve`)

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        end = self.offset + keys.shape[2]
        if end <= self.room and (self.keys is None or end > self.keys.shape[2]):
            self._grow(keys, values)
        return super().update_and_fetch(keys, values)

    def _grow(self, keys: mx.array, values: mx.array) -> None:
        """Buffers for `room` positions, holding what this cache holds; rounded up to a multiple of
        ROOM_STEP, so prompts of similar lengths meet the same sizes and a finished prompt's freed
        buffers can serve the next from MLX's buffer cache, at most ROOM_STEP - 1 positions over."""
        positions = -(-self.room // ROOM_STEP) * ROOM_STEP
        grown = []
        for old, new in ((self.keys, keys), (self.values, values)):
            buffer = mx.zeros((*new.shape[:2], positions, new.shape[3]), new.dtype)
            if old is not None and self.offset:
                buffer[..., : self.offset, :] = old[..., : self.offset, :]
            grown.append(buffer)
        self.keys, self.values = grown


class RowKV:
    """The KV of one sequence across all layers: own caches, or a slot in a `DecodeBatch`."""

    def __init__(self, n_layers: int, batch: DecodeBatch | None = None):
        self.layers: list[KVCache] | None = [PromptKV() for _ in range(n_layers)]
        self.batch = batch  # the decode batch this row may join (None: always own caches)
        self.slot: int | None = None  # index in batch.members while resident
        self.length = 0  # tokens held while resident (own caches track their own offset)

    @property
    def resident(self) -> bool:
        return self.slot is not None

    @property
    def offset(self) -> int:
        return self.length if self.resident else self.layers[0].offset

    def load(self, kv: list[LayerKV], n: int) -> None:
        """Start from the first `n` tokens of a stored prefix (copy-free slices)."""
        for cache, (keys, values) in zip(self.layers, kv):
            cache.state = (keys[..., :n, :], values[..., :n, :], n)

    def reserve(self, positions: int) -> None:
        """Let the own caches take room for `positions` at once when they next grow (PromptKV)."""
        for cache in self.layers or []:
            cache.room = positions

    def trim(self, n: int) -> None:
        """Forget the last `n` positions (rejected draft tokens); later writes overwrite them."""
        if n <= 0:
            return
        if self.resident:
            self.length -= n
        else:
            for cache in self.layers:
                cache.trim(n)

    def layer_kv(self, li: int, n: int) -> LayerKV:
        """Layer `li`'s first `n` tokens, (1, kv_heads, n, head_dim) each (lazy slices)."""
        if self.resident:
            return self.batch.row_kv(li, self.slot, n)
        c = self.layers[li]
        return c.keys[..., :n, :], c.values[..., :n, :]

    def snapshot(self, n: int | None = None) -> list[LayerKV]:
        """The first `n` tokens (default: all) as per-layer arrays for the prefix cache.

        Copied, so the stored entry does not keep this row's (or the batch's) buffers alive;
        evaluated at once on the CPU (`settle`).
        """
        n = self.offset if n is None else n
        out = [tuple(mx.contiguous(a) for a in self.layer_kv(li, n)) for li in range(self.n_layers)]
        settle(out)
        return out

    @property
    def n_layers(self) -> int:
        return len(self.batch.kv) if self.resident else len(self.layers)

    def arrays(self) -> list[mx.array]:
        """The arrays holding this row's KV, to queue their evaluation."""
        if self.resident:
            return list(self.batch.kv)
        return [c.keys for c in self.layers if c.keys is not None]

    def release(self) -> None:
        """Give back the batch slot (own caches go when the object does)."""
        if self.resident:
            self.batch.leave(self)

    @property
    def nbytes(self) -> int:
        if self.resident:
            return self.batch.nbytes // max(len(self.batch.members), 1)
        return sum(c.nbytes for c in self.layers)


class DecodeBatch:
    """Shared K/V of the decoding rows: per layer one (2 * rows_cap, kv_heads, t_cap, head_dim)
    array, the keys of slot i at row i and its values at row rows_cap + i, so a step writes
    both with one scatter and attention reads each half as a plain slice.

    Slot `i` belongs to `members[i]`; its positions 0..length-1 are valid, the rest is padding
    masked out by the attention. A row leaving moves the last member into its slot, so members
    always fill slots 0..M-1.
    """

    def __init__(self, n_layers: int, least_slots: int = 4):
        self.kv: list[mx.array] = []
        self.n_layers = n_layers
        self.least_slots = least_slots  # row_capacity's floor: a shape of the compiled step
        self.members: list[RowKV] = []
        self.rows_cap = 0
        self.t_cap = 0

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.kv)

    @property
    def kv_heads(self) -> int:
        return self.kv[0].shape[1]

    def fits(self, n: int) -> bool:
        """Whether a row of `n` tokens may join without padding the batch past MAX_PADDING."""
        lengths = [m.length for m in self.members] + [n]
        padded = len(lengths) * token_capacity(max(lengths) + 1)
        return padded <= MAX_PADDING * sum(lengths) + len(lengths) * T_STEP

    def join(self, row: RowKV) -> None:
        """Move `row`'s own caches into a new slot (one copy per layer); its caches are dropped."""
        n = row.offset
        first = row.layers[0]
        self.reserve(len(self.members) + 1, n + 1, first.keys.shape[1], first.keys.shape[3],
                     first.values.shape[3], first.keys.dtype)
        slot, values_at = len(self.members), self.rows_cap + len(self.members)
        for a, cache in zip(self.kv, row.layers):
            a[slot : slot + 1, :, :n, :] = cache.keys[..., :n, :]
            a[values_at : values_at + 1, :, :n, :] = cache.values[..., :n, :]
        self.members.append(row)
        row.slot, row.length, row.layers = slot, n, None

    def leave(self, row: RowKV) -> None:
        """Free `row`'s slot: the last member moves into it; an empty batch frees its arrays."""
        slot, last, rc = row.slot, len(self.members) - 1, self.rows_cap
        if slot != last:
            moved = self.members[last]
            n = moved.length  # includes a token written by a step already queued
            # The moved row is copied out first (`settle`): written from a slice of itself, a
            # layer's array cannot take the write in place (the slice holds its buffer), and MLX
            # copied the whole array, twice a layer (docs/benchmarks-log.md, "A row leaving the
            # decode batch").
            parts = [(mx.contiguous(a[last : last + 1, :, :n]), mx.contiguous(a[rc + last : rc + last + 1, :, :n]))
                     for a in self.kv]
            settle(parts)
            for a, (keys, values) in zip(self.kv, parts):
                a[slot : slot + 1, :, :n] = keys
                a[rc + slot : rc + slot + 1, :, :n] = values
            self.members[slot] = moved
            moved.slot = slot
        self.members.pop()
        row.slot = None
        row.batch = None
        self._shrink()

    def reserve(self, rows: int, t: int, kv_heads: int | None = None, k_dim: int | None = None,
                v_dim: int | None = None, dtype=None) -> None:
        """Grow the arrays to hold `rows` rows of `t` positions (rows double, t in blocks)."""
        if not self.kv:
            if k_dim != v_dim:  # llama/qwen-family layers (the only ones batched) have k_dim == v_dim
                raise ValueError(f"keys of width {k_dim} and values of width {v_dim} cannot share one array")
            self.rows_cap, self.t_cap = row_capacity(rows, self.least_slots), token_capacity(t)
            self.kv = [mx.zeros((2 * self.rows_cap, kv_heads, self.t_cap, k_dim), dtype)
                       for _ in range(self.n_layers)]
            return
        if rows > self.rows_cap:
            self._resize(row_capacity(rows, self.least_slots), self.t_cap)
        if t > self.t_cap:
            self._resize(self.rows_cap, token_capacity(t))

    def _resize(self, rows: int, t: int) -> None:
        """New arrays of `rows` slots and `t` positions holding what fits of the current ones."""
        keep_rows, keep_t, rc = min(rows, self.rows_cap), min(t, self.t_cap), self.rows_cap
        for li, a in enumerate(self.kv):
            b = mx.zeros((2 * rows, a.shape[1], t, a.shape[3]), a.dtype)
            b[:keep_rows, :, :keep_t] = a[:keep_rows, :, :keep_t]
            b[rows : rows + keep_rows, :, :keep_t] = a[rc : rc + keep_rows, :, :keep_t]
            self.kv[li] = b
        self.rows_cap, self.t_cap = rows, t

    def _shrink(self) -> None:
        # Padding follows the longest member: give memory back once it is far below capacity.
        if not self.members:
            self.kv, self.rows_cap, self.t_cap = [], 0, 0
            return
        rows = self.rows_cap
        while rows > self.least_slots and len(self.members) <= rows // 4:  # one row alone: the least slots
            rows //= 2
        t = token_capacity(max(m.length for m in self.members) + 1)
        t = t if t <= self.t_cap // 2 else self.t_cap
        if rows != self.rows_cap or t != self.t_cap:
            self._resize(rows, t)

    def write(self, li: int, index: tuple, kv: mx.array) -> None:
        """Scatter new tokens' keys and values, kv (2 * tokens, kv_heads, 1, dim) (the keys, then
        the values): `index` = (rows, heads, positions) arrays of shape (2 * tokens, kv_heads, 1)."""
        self.kv[li][index] = kv

    def view(self, li: int, t: int, slots: mx.array | None) -> LayerKV:
        """Every member's first `t` positions (`slots` None), or those of `slots` in that order."""
        a, m, rc = self.kv[li], len(self.members), self.rows_cap
        if slots is None:
            return a[:m, :, :t], a[rc : rc + m, :, :t]
        both = a[mx.concatenate([slots, slots + rc]), :, :t]
        return both[: slots.size], both[slots.size :]

    def row_kv(self, li: int, slot: int, n: int) -> LayerKV:
        a, at = self.kv[li], self.rows_cap + slot
        return a[slot : slot + 1, :, :n, :], a[at : at + 1, :, :n, :]


def token_capacity(t: int) -> int:
    """The token capacity for `t` positions: powers of two from T_STEP and one and a half times
    each (256, 384, 512, 768, 1024, 1536, …), at most 1.5× the positions held. Each capacity is
    a shape of the compiled decode step: few of them, so they can be compiled before they are
    needed (docs/arch/engine.md, "Shapes")."""
    cap = T_STEP
    while cap < t:
        cap = cap * 3 // 2 if cap & (cap - 1) == 0 else cap * 4 // 3
    return cap


def row_capacity(rows: int, least: int = 4) -> int:
    """Slots for `rows` rows: a power of two, at least `least` (4 where steps compile: each slot
    count is a shape of the compiled decode step)."""
    return max(least, 1 << (max(rows, 1) - 1).bit_length())


def kv_bytes_per_token(model) -> int:
    """Bytes of K and V one token takes across all layers, from the layers' k_proj widths."""
    total = 0
    for layer in model.layers:
        attn = getattr(layer, "self_attn", None)
        k_proj = getattr(attn, "k_proj", None)
        # k_proj's output width is kv_heads * head_dim (also for quantized weights).
        width = k_proj.weight.shape[0] if k_proj is not None else model.args.hidden_size
        total += 2 * width
    return total * kv_dtype_size(model)


def kv_dtype_size(model) -> int:
    """Bytes per KV element: activations follow the float type of the embedding (or its scales)."""
    embed = model.model.embed_tokens
    ref = getattr(embed, "scales", None)
    ref = ref if ref is not None else embed.weight
    return ref.dtype.size
