"""Steady-state decode feeds the last step's tokens and keys back as whole arrays (or one
gather), never one slice per row, and stays token-identical to each request alone."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import locals.engine.forward.forward as forward_mod
from locals.engine.engine import Engine
from locals.engine.forward.rowfeed import RowOf, join_rows
from locals.engine.rows.sampling import apply_masks
from locals.engine.settings import EngineConfig
from locals.protocol import GenerationRequest, SamplingParams

from tests.helpers.engine_runs import Collector, make_prompts, run_alone


def test_join_rows_whole_slice_gather_and_plain_parts():
    tokens = mx.array([10, 11, 12, 13], dtype=mx.int32)
    rows = [RowOf(tokens, i) for i in range(4)]
    assert join_rows(rows) is tokens  # the previous step's array itself: no op at all
    assert join_rows(rows[1:3]).tolist() == [11, 12]
    assert join_rows([rows[2], rows[0], rows[3]]).tolist() == [12, 10, 13]
    extra = mx.array([7, 8], dtype=mx.int32)
    assert join_rows([rows[0], rows[1], extra, rows[3]]).tolist() == [10, 11, 7, 8, 13]


def test_join_rows_stacks_keys_and_broadcasts_repeated_rows():
    keys = mx.array([[1, 2], [3, 4], [5, 6]], dtype=mx.uint32)
    own = mx.array([9, 9], dtype=mx.uint32)
    out = join_rows([RowOf(keys, 2), RowOf(keys, 0), own, own, own], stack=True)
    assert out.tolist() == [[5, 6], [1, 2], [9, 9], [9, 9], [9, 9]]
    assert RowOf(keys, 1).value().tolist() == [3, 4] and RowOf(keys, 1).take().shape == (1, 2)


def test_masks_of_repeated_and_missing_rows_match_per_row_masks():
    vocab = 40
    logits = mx.zeros((4, vocab))
    only_3 = mx.array([0b1000, 0], dtype=mx.uint32)
    only_33 = mx.array([0, 0b10], dtype=mx.uint32)
    out = np.array(apply_masks(logits, [only_3, only_3, None, only_33]))
    allowed = [np.flatnonzero(np.isfinite(row)).tolist() for row in out]
    assert allowed == [[3], [3], list(range(vocab)), [33]]


class FeedSpy:
    """Counts per-row slices of fed rows and how the ragged pass got its tokens."""

    def __init__(self, monkeypatch):
        self.slices = self.whole = self.gathered = 0
        take, join = RowOf.take, forward_mod.join_rows

        def counting_take(row):
            self.slices += 1
            return take(row)

        def watching_join(parts, stack=False):
            out = join(parts, stack)
            fed = [p for p in parts if isinstance(p, RowOf)]
            if fed and len(fed) == len(parts):
                if out is fed[0].array:
                    self.whole += 1
                else:
                    self.gathered += 1
            return out

        monkeypatch.setattr(RowOf, "take", counting_take)
        monkeypatch.setattr(forward_mod, "join_rows", watching_join)


@pytest.fixture()
def engine(tiny_llama):
    eng = Engine(tiny_llama, EngineConfig(prefix_cache_bytes=0, speculate=False))
    eng.start()
    yield eng
    eng.stop()


def test_batch_decodes_through_the_fast_path_identical_to_alone(engine, tiny_llama, monkeypatch):
    prompts = make_prompts(tiny_llama.tokenizer, [7, 12, 19, 26])
    params = [dict(max_tokens=24), dict(max_tokens=6),  # the second row leaves mid-way
              dict(max_tokens=24, temperature=0.9, top_p=0.95, seed=11), dict(max_tokens=24)]
    alone = [run_alone(engine, p, **kw)[0] for p, kw in zip(prompts, params)]
    spy = FeedSpy(monkeypatch)
    c = Collector()
    ids = [c.submit(engine, GenerationRequest(p, SamplingParams(**kw))) for p, kw in zip(prompts, params)]
    c.wait()
    for rid, expected, kw in zip(ids, alone, params):
        assert c.tokens(rid) == expected
        assert len(expected) == kw["max_tokens"] and c.finish(rid).reason == "length"
    assert spy.slices == 0  # no row's token or key was sliced out on its own
    # Every decode step fed its rows from the last step's tokens as that whole array, but two
    # gathers: the step without the leaver's row, and the one after its slot was refilled.
    assert spy.gathered <= 2
    assert spy.whole >= 20


def test_per_row_fallback_gets_its_tokens_as_arrays(tiny_llama, monkeypatch):
    # Models outside the ragged family run one mlx-lm call per row, which needs real arrays.
    import locals.engine.engine as engine_mod
    import locals.engine.step as step_mod

    for mod in (forward_mod, step_mod, engine_mod):
        monkeypatch.setattr(mod, "supports_ragged", lambda model: False)
    eng = Engine(tiny_llama, EngineConfig(prefix_cache_bytes=0, speculate=False))
    eng.start()
    try:
        prompts = make_prompts(tiny_llama.tokenizer, [5, 11, 17])
        alone = [run_alone(eng, p, max_tokens=10)[0] for p in prompts]
        c = Collector()
        ids = [c.submit(eng, GenerationRequest(p, SamplingParams(max_tokens=10))) for p in prompts]
        c.wait()
        assert [c.tokens(rid) for rid in ids] == alone
        assert eng.decode_batch is None
    finally:
        eng.stop()
