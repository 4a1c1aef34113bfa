"""Driving a real Engine from tests: collect each request's events, run one prompt alone,
build prompts of given lengths, wait for a condition, make KV blocks for a prefix cache."""

from __future__ import annotations

import threading
import time

import mlx.core as mx

from locals.engine.engine import Engine
from locals.protocol import FinishEvent, GenerationRequest, SamplingParams, TokenEvent


class Collector:
    """Gathers each request's events; `wait()` returns once every request finished."""

    def __init__(self):
        self.events: dict[str, list] = {}
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.expected = 0

    def submit(self, engine: Engine, request: GenerationRequest) -> str:
        with self.lock:
            self.events[request.id] = []
            self.expected += 1
        engine.submit(request, lambda ev, rid=request.id: self._on(rid, ev))
        return request.id

    def _on(self, rid: str, ev) -> None:
        with self.lock:
            self.events[rid].append(ev)
            finished = sum(1 for evs in self.events.values() if evs and isinstance(evs[-1], FinishEvent))
            if finished == self.expected:
                self.done.set()

    def wait(self, timeout: float = 120) -> None:
        assert self.done.wait(timeout), "requests did not finish"

    def tokens(self, rid: str) -> list[int]:
        return [t for ev in self.events[rid] if isinstance(ev, TokenEvent) for t in ev.tokens]

    def text(self, rid: str) -> str:
        return "".join(ev.text for ev in self.events[rid] if isinstance(ev, TokenEvent))

    def finish(self, rid: str) -> FinishEvent:
        return self.events[rid][-1]


def wait_for(condition, timeout: float = 60) -> bool:
    deadline = time.time() + timeout
    while not condition():
        if time.time() > deadline:
            return False
        time.sleep(0.01)
    return True


def run_alone(engine: Engine, prompt: list[int], **sampling) -> tuple[list[int], str, FinishEvent]:
    c = Collector()
    rid = c.submit(engine, GenerationRequest(prompt, SamplingParams(**sampling)))
    c.wait()
    return c.tokens(rid), c.text(rid), c.finish(rid)


def make_prompts(tokenizer, lengths: list[int]) -> list[list[int]]:
    base = tokenizer.encode("The quick brown fox jumps over the lazy dog while the cat sleeps. " * 20,
                            add_special_tokens=False)
    return [base[i : i + n] for i, n in enumerate(lengths)]


def kv_blocks(n: int, fill: float = 1.0) -> list[tuple[mx.array, mx.array]]:
    """One layer's keys and values for `n` tokens (2 heads of 4), as a prefix cache stores them."""
    return [(mx.full((1, 2, n, 4), fill), mx.full((1, 2, n, 4), fill))]
