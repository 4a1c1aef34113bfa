"""A process-wide on/off for one kind of kernel: on unless some `off()` is active (nestable).

Benchmarks use it to time a kernel against MLX's ops on one engine (not for concurrent
serving); compiled graphs that trace the kernel are keyed by `on`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class Switch:
    """On until `off()` is entered; on again once every `off()` has exited."""

    def __init__(self):
        self._depth = 0

    @contextmanager
    def off(self) -> Iterator[None]:
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1

    @property
    def on(self) -> bool:
        return self._depth == 0
