"""Tuning on first use: on a GPU whose tuning table lacks the loaded model's layers, the engine
thread verifies and times the kernels while no request is around (pausing the moment one
arrives), saves the table after each slice, and swaps in a layer shape's winners as soon as
all its row counts are timed (largest layers first). Candidates are verified once per
process, one at a time, so a slice never blocks long.

The same work as `locals tune`, run as the engine's idle work; on a CPU there is nothing
to tune (the engine runs dense weights there).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable


from locals.engine.kernels.registry import patch_model, reroute
from locals.engine.kernels.tuning.tuner import (current_chip, default_candidates, load_table, model_problems, new_table,
                                          save_table, screen, tune, tuning_rows)

log = logging.getLogger(__name__)

BACKGROUND_ROUNDS = 5  # fewer than `locals tune`'s 7: a slice must end soon after a request arrives


class BackgroundTuning:
    """The engine's idle work for one model: tune what is missing, swapping in each layer shape once timed."""

    def __init__(self, model, rows: range | list[int] | None = None,
                 on_patch: Callable[[int], None] | None = None):
        self.model = model
        self.rows = tuning_rows(current_chip()[0]) if rows is None else list(rows)
        self.problems = model_problems(model)
        self.table = load_table()
        self.patched = 0
        self.on_patch = on_patch  # told how many more layers use tuned kernels
        self._patched_keys: set[str] = set()
        self.left = self.missing  # refreshed after each slice; other threads read this, not `missing`
        self._unscreened: list | None = None  # candidates not verified yet (None: not started)
        self._pool: list = []  # candidates that passed verification

    def _screen_step(self, interrupted: Callable[[], bool]) -> bool:
        """Verify candidates one by one until all are done (True) or `interrupted()` (False)."""
        if self._unscreened is None:
            self.table = self.table or new_table()
            self._unscreened = default_candidates(current_chip()[0])
        while self._unscreened:
            passed = screen(self._unscreened[:1], self.problems, self.table, pause=interrupted,
                            max_rows=max(self.rows))
            if passed is None:  # interrupted mid-way: this candidate starts over next time
                return False
            self._pool += passed
            self._unscreened.pop(0)
        return True

    @property
    def missing(self) -> int:
        """(problem, rows) pairs this chip's table has no choice for yet."""
        choices = self.table.choices if self.table is not None else {}
        return sum(1 for p in self.problems for m in self.rows if str(m) not in choices.get(p.key, {}))

    def __call__(self, interrupted: Callable[[], bool]) -> bool:
        """Tune until `interrupted()` or done; True while work remains."""
        if not self.missing:
            return False
        log.info("tuning kernels while idle: %d layer shape x row count pairs left", self.missing)
        if not self._screen_step(interrupted):
            return True
        self.table = tune(self.problems, rows=self.rows, candidates=self._pool, table=self.table,
                          pause=interrupted, rounds=BACKGROUND_ROUNDS, screened=True)
        save_table(self.table)
        self._patch_finished()
        self.left = self.missing
        if self.left:
            return True
        log.info("kernel tuning done: %d layers now use tuned kernels", self.patched)
        return False

    def _patch_finished(self) -> None:
        """Swap in the tuned kernels of every layer shape whose row counts are all timed; layers
        swapped at load (a table cut short) take the new row counts' choices too."""
        done = {p.key for p in self.problems
                if all(str(m) in self.table.choices.get(p.key, {}) for m in self.rows)} - self._patched_keys
        if not done:
            return
        finished = dataclasses.replace(self.table, choices={k: self.table.choices[k] for k in done})
        swapped = patch_model(self.model, finished)
        rerouted = reroute(self.model, finished)
        if rerouted:
            log.info("%d tuned layers now route the newly timed row counts too", rerouted)
        self._patched_keys |= done
        self.patched += swapped
        if swapped and self.on_patch is not None:
            self.on_patch(swapped)


def background_tuning(loaded) -> BackgroundTuning | None:
    """The idle work for `loaded`, or None when nothing needs tuning (CPU, no quantized layers, tuned)."""
    backend = getattr(loaded, "backend", None)
    if backend is None or getattr(backend, "kind", "cpu") == "cpu":
        return None
    work = BackgroundTuning(loaded.model)
    return work if work.missing else None
