"""Rows of one step's batch arrays (sampled tokens, next PRNG keys) fed into the next step
without slicing each row out: a row is held as (array, index), and a batch of such rows
becomes the array itself, one slice or one gather.

Each MLX op costs graph building and dispatch on the host; one slice per row per step
made the host cost of a decode step grow with the batch. Pure array plumbing: no
sequences, no model.
"""

from __future__ import annotations

import mlx.core as mx


class RowOf:
    """Row `index` of a (lazy) batch array, not sliced out until someone needs it alone."""

    __slots__ = ("array", "index")

    def __init__(self, array: mx.array, index: int):
        self.array = array
        self.index = index

    def take(self) -> mx.array:
        """This row alone, keeping the leading axis: shape (1, ...)."""
        return self.array[self.index : self.index + 1]

    def value(self) -> mx.array:
        """This row alone, without the leading axis."""
        return self.array[self.index]


def as_array(part: RowOf | mx.array) -> mx.array:
    """`part` as an array of its own: a RowOf's row (leading axis kept), a plain array as is."""
    return part.take() if isinstance(part, RowOf) else part


def join_rows(parts: list[RowOf | mx.array], stack: bool = False) -> mx.array:
    """`parts` joined along axis 0, in order.

    Runs of consecutive `RowOf` of one array cost nothing when they are that whole array in
    order, one slice when contiguous, else one gather. Plain arrays are concatenated as they
    are, or (`stack`) each as one row of the result, a run of one same array broadcast once.
    """
    groups: list[tuple[tuple | None, list]] = []
    for part in parts:
        key = ("rows", id(part.array)) if isinstance(part, RowOf) else ("same", id(part)) if stack else None
        if key is not None and groups and groups[-1][0] == key:
            groups[-1][1].append(part)
        else:
            groups.append((key, [part]))
    pieces = [_piece(members, stack) for _, members in groups]
    return pieces[0] if len(pieces) == 1 else mx.concatenate(pieces)


def _piece(members: list, stack: bool) -> mx.array:
    first = members[0]
    if isinstance(first, RowOf):
        return _rows(first.array, [m.index for m in members])
    if not stack:
        return first
    row = first[None]
    return row if len(members) == 1 else mx.broadcast_to(row, (len(members), *first.shape))


def _rows(array: mx.array, indices: list[int]) -> mx.array:
    first, n = indices[0], len(indices)
    if indices[-1] - first == n - 1 and indices == list(range(first, first + n)):
        return array if n == array.shape[0] else array[first : first + n]
    return mx.take(array, mx.array(indices), axis=0)
