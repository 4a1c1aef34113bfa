"""The engine most tests in this folder drive: the tiny llama with a small step budget, so
prompts are read in several chunks beside decoding rows (a module may define its own)."""

from __future__ import annotations

import pytest

from locals.engine.engine import Engine
from locals.engine.settings import EngineConfig


@pytest.fixture()
def engine(tiny_llama):
    # Pipelined as on a GPU (the CPU's default reads each step first: host_attention.py).
    eng = Engine(tiny_llama, EngineConfig(step_token_budget=24, min_prefill_chunk=4, prefix_cache_bytes=0, pipeline=True))
    eng.start()
    yield eng
    eng.stop()
