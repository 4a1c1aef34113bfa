"""Idle work in the engine (kernel tuning on first use): it runs only while no request is
around, yields as soon as one arrives, resumes after, and its table is saved slice by slice."""

from __future__ import annotations

import threading
import time

import mlx.core as mx
import mlx.nn as nn

from locals.engine.engine import Engine
from locals.engine.kernels.tuning.background import BackgroundTuning
from locals.engine.kernels.tuning.tuner import load_table
from locals.engine.settings import EngineConfig
from locals.protocol import GenerationRequest, SamplingParams
from tests.test_engine import Collector


class SlicedWork:
    """Idle work of `total` slices of ~20 ms; records when it was interrupted."""

    def __init__(self, total: int):
        self.left = total
        self.interrupts = 0
        self.started = threading.Event()

    def __call__(self, interrupted) -> bool:
        self.started.set()
        while self.left > 0:
            if interrupted():
                self.interrupts += 1
                return True
            time.sleep(0.02)
            self.left -= 1
        return False


def test_idle_work_yields_to_requests_and_finishes_after(tiny_llama):
    engine = Engine(tiny_llama, EngineConfig(prefix_cache_bytes=0, idle_work_after_s=0))
    work = SlicedWork(total=200)  # ~4 s of work
    engine.idle_work = work
    engine.start()
    try:
        assert work.started.wait(10)
        c = Collector()
        prompt = tiny_llama.tokenizer.encode("hello there", add_special_tokens=False)
        rid = c.submit(engine, GenerationRequest(prompt, SamplingParams(max_tokens=4)))
        c.wait(30)
        # The request was served while work remained: the work yielded to it.
        assert c.finish(rid).reason == "length"
        assert work.interrupts >= 1 and work.left > 0
        deadline = time.time() + 20
        while engine.idle_work is not None and time.time() < deadline:
            time.sleep(0.05)
        assert work.left == 0 and engine.idle_work is None
    finally:
        engine.stop()


def test_failing_idle_work_never_stops_serving(tiny_llama):
    def broken(interrupted):
        raise RuntimeError("boom")

    engine = Engine(tiny_llama, EngineConfig(prefix_cache_bytes=0, idle_work_after_s=0))
    engine.idle_work = broken
    engine.start()
    try:
        c = Collector()
        rid = c.submit(engine, GenerationRequest([1, 2, 3], SamplingParams(max_tokens=3)))
        c.wait(30)
        assert c.finish(rid).reason == "length" and engine.idle_work is None
    finally:
        engine.stop()


def test_idle_work_waits_for_a_quiet_period(tiny_llama):
    engine = Engine(tiny_llama, EngineConfig(prefix_cache_bytes=0, idle_work_after_s=1.5))
    work = SlicedWork(total=5)
    engine.idle_work = work
    engine.start()
    try:
        # Requests 0.5 s apart (an agent's turns): the work never starts between them.
        for _ in range(4):
            c = Collector()
            rid = c.submit(engine, GenerationRequest([1, 2, 3], SamplingParams(max_tokens=2)))
            c.wait(30)
            assert c.finish(rid).reason == "length"
            time.sleep(0.5)
            assert not work.started.is_set()
        # Quiet for longer than the delay: now it runs to the end.
        assert work.started.wait(10)
        deadline = time.time() + 10
        while engine.idle_work is not None and time.time() < deadline:
            time.sleep(0.05)
        assert work.left == 0
    finally:
        engine.stop()


def _quantized_model():
    mx.random.seed(0)
    # Two layer shapes (never called: only their quantized weights are tuned).
    model = nn.Sequential(nn.Linear(128, 40), nn.Linear(128, 64))
    nn.quantize(model, group_size=64, bits=4)
    return model


def test_background_tuning_resumes_and_saves_each_slice(locals_home):
    model = _quantized_model()
    work = BackgroundTuning(model, rows=[1, 2])
    assert work.missing == 4  # two layer shapes x two row counts

    def after_first_pair():  # stop as soon as one (shape, rows) pair has its choice
        return work.table is not None and sum(len(v) for v in work.table.choices.values()) >= 1

    assert work(after_first_pair) is True
    saved = load_table()
    assert saved is not None and work.missing == 3
    assert sum(len(v) for v in saved.choices.values()) == 1
    assert work(lambda: False) is False and work.missing == 0
    assert sum(len(v) for v in load_table().choices.values()) == 4


def test_background_verification_is_interruptible_and_done_once(locals_home, monkeypatch):
    from locals.engine.kernels.tuning import background

    model = _quantized_model()
    screened = []
    real_screen = background.screen

    def counting_screen(candidates, problems, table, *a, **k):
        screened.extend(c.name for c in candidates)
        return real_screen(candidates, problems, table, *a, **k)

    monkeypatch.setattr(background, "screen", counting_screen)
    work = BackgroundTuning(model, rows=[1])
    asks = {"n": 0}

    def after_one_case():  # asked before each verification case: let one through, then stop
        asks["n"] += 1
        return asks["n"] > 1

    assert work(after_one_case) is True
    assert len(screened) == 1 and work.missing == 2  # stopped inside the first candidate, nothing timed
    assert work(lambda: False) is False and work.missing == 0
    # The interrupted candidate started over; every other one was verified exactly once.
    assert screened[0] == screened[1] and len(screened) == len(set(screened)) + 1 >= 3


def test_background_tuning_swaps_each_layer_shape_once_timed_largest_first(locals_home):
    from locals.engine.kernels.registry import TunedQuantizedLinear

    mx.random.seed(0)
    model = nn.Sequential(nn.Linear(256, 128), nn.Linear(256, 192))
    model.set_dtype(mx.bfloat16)
    nn.quantize(model, group_size=64, bits=4)
    told = []
    # bfloat16 at 3-4 rows: on a CPU MLX's quantized op takes ~2-3x as long as
    # dequantize-then-matmul there, so each shape gets a route and its layer is swapped.
    work = BackgroundTuning(model, rows=[3, 4], on_patch=told.append)
    assert [p.n for p in work.problems] == [192, 128]

    def after_first_shape():
        return work.table is not None and len(work.table.choices.get(work.problems[0].key, {})) == 2

    assert work(after_first_shape) is True
    small, large = model.layers
    assert isinstance(large, TunedQuantizedLinear) and not isinstance(small, TunedQuantizedLinear)
    assert told == [1] and work.patched == 1 and work.left == 2
    assert work(lambda: False) is False
    assert isinstance(model.layers[0], TunedQuantizedLinear) and told == [1, 1] and work.patched == 2
    assert work.left == 0


def test_layers_swapped_at_load_take_the_row_counts_tuned_while_idle(locals_home):
    from locals.engine.kernels.registry import TunedQuantizedLinear, patch_model
    from locals.engine.kernels.tuning.tuner import TuningTable, current_chip, kernels_tag, save_table

    mx.random.seed(0)
    model = nn.Sequential(nn.Linear(256, 128), nn.Linear(256, 192))
    model.set_dtype(mx.bfloat16)
    nn.quantize(model, group_size=64, bits=4)
    kind, chip = current_chip()
    work = BackgroundTuning(model, rows=[3, 4])
    # A table cut short: 3 rows tuned for both shapes, 4 rows not yet.
    save_table(TuningTable(chip=chip, mlx=mx.__version__, kernels=kernels_tag(kind),
                           choices={p.key: {"3": "mlx-dequant"} for p in work.problems}))
    assert patch_model(model) == 2  # as the engine does at load
    assert all(sorted(layer._routes.kernels) == [3] for layer in model.layers)
    work = BackgroundTuning(model, rows=[3, 4])
    assert work.missing == 2
    assert work(lambda: False) is False and work.missing == 0
    table = load_table()
    for layer, problem in zip(model.layers, [p for p in work.problems[::-1]]):
        assert isinstance(layer, TunedQuantizedLinear)
        chosen = {int(m) for m, name in table.choices[problem.key].items() if name != "mlx"}
        assert set(layer._routes.kernels) == chosen  # 4 rows routed as tuned, without a restart
    # On a CPU dequantize-then-matmul beats MLX's quantized op at 3-4 bf16 rows (see above).
    assert any(4 in layer._routes.kernels for layer in model.layers)
