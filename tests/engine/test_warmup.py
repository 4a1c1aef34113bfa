"""Decode-step shapes compiled ahead (locals/engine/warmup.py): the list covers every shape a
decode batch can reach, and once an engine has compiled them, requests of many lengths and
batch sizes run no pass uncompiled; their tokens are those of an engine that compiles on use."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from locals.engine.engine import Engine
from locals.engine.forward.forward import step_rows
from locals.engine.load.backend import detect
from locals.engine.forward.kv import row_capacity, token_capacity
from locals.engine.settings import EngineConfig
from locals.engine.stats import SLOW_STEP_S, Counters, StepIntervals
from locals.engine import stats as stats_mod, step as step_mod, warmup
from locals.engine.forward.host_attention import SOFTMAX_ON_HOST
from locals.engine.warmup import step_shapes
from locals.protocol import GenerationRequest, SamplingParams

from tests.helpers.engine_runs import Collector, make_prompts, run_alone, wait_for
from tests.helpers.kernel_models import as_on_a_gpu

# What a GPU's engine does by default and the CPU's does not: compile short passes (and so
# compile them ahead), 256 tokens a step, and read a prompt alone 8 budgets a step.
AS_ON_A_GPU = dict(forward=as_on_a_gpu(), step_token_budget=256, solo_prefill_factor=8)


@pytest.mark.parametrize("max_batch", [1, 4, 5, 12, 64])
def test_the_shapes_cover_every_batch_a_step_can_meet(max_batch):
    shapes = set(step_shapes(max_batch, 4096, 10**12))
    for members in range(1, max_batch + 1):
        # Slots grow to row_capacity(rows) (never past max_batch's) and shrink while a quarter or less are used.
        reachable = [s for s in (4, 8, 16, 32, 64, 128) if row_capacity(members) <= s <= row_capacity(max_batch)
                     and (s == 4 or members > s // 4)]
        for slots in reachable:
            for positions in (1, 255, 256, 257, 400, 1000, 3000, 4096):
                assert (step_rows(members, slots), slots, token_capacity(positions)) in shapes


def test_kv_budget_bounds_each_shape_and_agents_contexts_come_first_at_every_slot_count():
    shapes = step_shapes(64, 40960, 390 * 1024)  # an H200's KV budget for a 4B model
    assert shapes and all(slots * t_cap <= 390 * 1024 for _rows, slots, t_cap in shapes)
    assert shapes[:3] == [(1, 4, 256), (1, 4, 384), (1, 4, 512)]
    agents = [s for s in shapes if s[2] <= warmup.AGENTS_CONTEXT]
    assert shapes[:len(agents)] == sorted(agents, key=lambda s: (s[1], s[0], s[2]))
    # 8 and 16 agents at 8-16k tokens come before one row at 24k and more.
    assert shapes.index((8, 8, 12288)) < shapes.index((16, 16, 8192)) < shapes.index((1, 4, 24576))
    assert (8, 8, 16384) in agents and (1, 4, 49152) in shapes


def test_after_compiling_ahead_requests_run_no_pass_uncompiled(tiny_llama):
    engine = Engine(tiny_llama, EngineConfig(prefix_cache_bytes=0, max_batch=4, speculate=False, warm_up_s=0.5,
                                             kv_budget_bytes=64 << 20, **AS_ON_A_GPU))
    plain = Engine(tiny_llama, EngineConfig(prefix_cache_bytes=0, max_batch=4, speculate=False,
                                            kv_budget_bytes=64 << 20))
    engine.start()
    plain.start()
    try:
        assert engine.ready.wait(120)
        assert wait_for(lambda: not engine.stats().extra["compiling_ahead"], timeout=600)
        compiled = engine.stats().extra
        assert compiled["compiled_shapes"] > 0 and compiled["uncompiled_passes"] == 0
        prompts = make_prompts(tiny_llama.tokenizer, [3, 17, 40, 90, 130, 250, 300])
        for batch in (1, 2, 3, 4):
            c = Collector()
            ids = [c.submit(engine, GenerationRequest(p, SamplingParams(max_tokens=12, temperature=0)))
                   for p in prompts[:batch]]
            c.wait()
            for rid, prompt in zip(ids, prompts):
                assert c.tokens(rid) == run_alone(plain, prompt, max_tokens=12, temperature=0)[0]
        extra = engine.stats().extra
        assert extra["uncompiled_passes"] == 0 and extra["slowest_step_s"] > 0
        intervals = extra["step_intervals"]  # each batch read its prompts in one step, after a wait
        assert "with_prompt" not in intervals and intervals["decode"]["steps"] > 0
        assert 0 < intervals["decode"]["p50_ms"] <= intervals["decode"]["p99_ms"] <= intervals["decode"]["max_ms"]
    finally:
        engine.stop()
        plain.stop()


def test_a_slow_step_is_counted_and_logged_with_its_shape(caplog):
    counters = Counters()
    counters.note_step(0.05, SimpleNamespace(slots=[1, 2, 3], prefill_tokens=0), uncompiled_passes=0)
    assert counters.slow_steps == 0 and counters.slowest_step_s == 0.05 and not caplog.records
    with caplog.at_level("INFO", logger="locals.engine.engine"):
        counters.note_step(SLOW_STEP_S + 0.5, SimpleNamespace(slots=list(range(8)), prefill_tokens=248), 2)
    assert counters.slow_steps == 1 and counters.slowest_step_s == SLOW_STEP_S + 0.5
    assert "slow step: 2.5 s (8 rows, 248 prompt tokens; 2 passes uncompiled so far)" in caplog.text


def test_step_intervals_count_busy_reads_apart_by_kind():
    intervals = StepIntervals(keep=100)
    intervals.add(10.0, prompt_tokens=0)  # the first read has nothing before it
    for i in range(1, 101):
        intervals.add(10.0 + 0.01 * i, prompt_tokens=0)
    intervals.add(11.5, prompt_tokens=200)  # a mixed pass: 500 ms after the last read
    intervals.waited()
    intervals.add(30.0, prompt_tokens=0)  # after a wait for work: not a gap anyone saw
    summary = intervals.summary()
    assert summary["decode"] == {"steps": 100, "p50_ms": 10.0, "p99_ms": 10.0, "max_ms": 10.0}
    assert summary["with_prompt"] == {"steps": 1, "p50_ms": 500.0, "p99_ms": 500.0, "max_ms": 500.0}


def test_a_long_gap_between_step_reads_is_counted_and_logged_with_where_the_loop_spent_it(monkeypatch, caplog):
    now = [100.0]
    monkeypatch.setattr(stats_mod.time, "perf_counter", lambda: now[0])
    gaps = stats_mod.GapClock()

    def spend(phase: str, seconds: float) -> None:
        now[0] += seconds
        gaps.mark(phase)

    spend("build", 0.01)
    now[0] += 0.02
    gaps.read(0.03, rows=8, prompt_tokens=0)  # short: nothing kept
    spend("disk copy", 0.09)
    spend("build", 0.005)
    spend("queue", 0.002)
    spend("build", 0.003)
    now[0] += 0.04
    with caplog.at_level("INFO", logger="locals.engine.engine"):
        gaps.read(0.14, rows=8, prompt_tokens=248)
        spend("admit", 0.3)
        gaps.read(None, rows=1, prompt_tokens=0)  # after a wait for work: no gap anyone saw
    assert gaps.summary() == {"count": 1, "ms_by_phase": {"disk copy": 90.0, "read": 40.0, "build": 8.0,
                                                           "queue": 2.0}}
    assert len(caplog.messages) == 1
    assert caplog.messages[0].startswith("long gap: 140 ms between step reads (ms: disk copy 90, read 40, build 8, "
                                         "queue 2; the step read: 8 rows, 248 prompt tokens; MLX memory: ")


def test_a_long_gap_says_what_queuing_its_passes_took_from_the_device_and_gave_back(monkeypatch, caplog):
    now, reserved = [100.0], [0]
    monkeypatch.setattr(stats_mod.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(stats_mod, "reserved_bytes", lambda: reserved[0])
    gaps = stats_mod.GapClock()

    def queue(seconds: float, reserved_after: int) -> None:
        before = reserved[0]
        now[0] += seconds
        reserved[0] = reserved_after
        gaps.queued(before)

    for _ in range(3):
        gaps.read(0.02, rows=12, prompt_tokens=0)  # the typical gap: 20 ms
    reserved[0] = 40 * 10**9
    queue(0.001, 40 * 10**9)  # from MLX's buffer cache: nothing new
    queue(0.09, 41_500_000_000)  # a pass that allocated 1.5 GB it did not have cached
    queue(0.05, 38 * 10**9)  # cached buffers freed to make room
    with caplog.at_level("INFO", logger="locals.engine.engine"):
        gaps.read(0.141, rows=12, prompt_tokens=245)
        queue(0.001, 39 * 10**9)
        now[0] += 0.2
        gaps.read(0.201, rows=12, prompt_tokens=0)  # the next gap counts only its own queuing
    assert gaps.summary()["ms_by_phase"] == {"queue": 142.0, "read": 200.0}
    assert caplog.messages[0].endswith("queuing took 1.50 GB from the device, gave back 3.50)")
    assert caplog.messages[1].endswith("queuing took 1.00 GB from the device, gave back 0.00)")


def _gap_marks_of_one_request(engine, tiny_llama) -> list[str]:
    """The phases the runner marks on the gap clock while one short request runs alone."""
    marks = []
    engine.runner.gaps = SimpleNamespace(mark=marks.append, queued=lambda before: marks.append("queue"))
    try:
        run_alone(engine, make_prompts(tiny_llama.tokenizer, [12])[0], max_tokens=4)
    finally:
        engine.runner.gaps = engine.counters.gaps
    return marks


def test_the_runner_marks_mlx_queuing_a_pass_apart_from_building_it(engine, tiny_llama):
    marks = _gap_marks_of_one_request(engine, tiny_llama)
    assert marks.count("queue") >= 4  # the prompt's pass and each token's
    assert all(before == "build" for before, after in zip(marks, marks[1:]) if after == "queue")


def test_on_the_cpu_building_a_pass_that_runs_it_is_marked_apart_from_python_building(engine, tiny_llama):
    marks = _gap_marks_of_one_request(engine, tiny_llama)
    passes = marks.count(step_mod.RUN_AS_BUILT)
    assert passes >= 4 if SOFTMAX_ON_HOST else passes == 0  # the prompt's pass and each token's
    assert all(before == "build" for before, after in zip(marks, marks[1:]) if after == step_mod.RUN_AS_BUILT)


def test_where_every_step_takes_long_only_the_stalls_among_them_are_long_gaps(monkeypatch):
    monkeypatch.setattr(stats_mod.time, "perf_counter", lambda: 0.0)
    gaps = stats_mod.GapClock()
    for _ in range(50):  # a CPU: 300 ms a step, every step
        gaps.read(0.3, rows=8, prompt_tokens=0)
    assert gaps.summary()["count"] == 0
    gaps.read(0.9, rows=8, prompt_tokens=0)  # three steps' worth: a stall
    assert gaps.summary()["count"] == 1


def _traces_until_ready(tiny_llama, caplog) -> tuple[list[str], dict]:
    """What an engine that compiles ahead (a tiny budget) traced before it said ready, and its stats then."""
    engine = Engine(tiny_llama, EngineConfig(prefix_cache_bytes=0, max_batch=8, speculate=False, warm_up_s=1e-6,
                                             kv_budget_bytes=64 << 20, **{**AS_ON_A_GPU, "step_token_budget": 64}))
    with caplog.at_level("DEBUG", logger="locals.engine.warmup"):
        engine.start()
        try:
            assert engine.ready.wait(120)
            extra = engine.stats().extra
        finally:
            engine.stop()
    return [r.getMessage().split(" in ")[0] for r in caplog.records if r.getMessage().startswith("compiled ")], extra


def test_before_ready_the_uncompiled_passes_run_whatever_the_budget(tiny_llama, caplog, monkeypatch):
    # A prompt's first chunk read alone, the next, one past the composed attention's size, and a
    # chunk beside 4- and 8-row batches: on a
    # GPU new to MLX each meets kernels MLX compiles on first use, so they run before ready, not in a
    # request (a CPU compiles none and skips them: made to run them here).
    monkeypatch.setattr(warmup, "compiles_kernels_on_first_use", lambda: True)
    traced, extra = _traces_until_ready(tiny_llama, caplog)
    assert extra["compiled_shapes"] >= 6  # five uncompiled passes, then one shape at least
    assert traced[:5] == ["compiled prefill (512, 0)", "compiled prefill (64, 512)", "compiled prefill (512, 1024)",
                          "compiled step (4, 4, 256, 60)", "compiled step (8, 8, 256, 56)"]


def test_a_cpu_compiles_no_kernels_and_skips_the_uncompiled_passes(tiny_llama, caplog):
    traced, _ = _traces_until_ready(tiny_llama, caplog)
    assert traced and not any("prefill" in m for m in traced) and traced[0] == "compiled step (1, 4, 256)"


@pytest.mark.skipif(detect().kind != "cpu", reason="the CPU's defaults")
def test_the_cpu_compiles_nothing_ahead_and_is_ready_at_once(tiny_llama):
    engine = Engine(tiny_llama, EngineConfig(prefix_cache_bytes=0, max_batch=4, warm_up_s=30))
    engine.start()
    try:
        assert engine.ready.wait(10) and engine.warmer is None
        # Nor does it pipeline (building a step runs it); it reads prompts alone 256 tokens a step.
        assert not engine.config.pipeline and engine.scheduler.solo_budget == 256
        assert run_alone(engine, make_prompts(tiny_llama.tokenizer, [40])[0], max_tokens=4)[0]
        extra = engine.stats().extra
        assert (extra["compiled_shapes"], extra["compiling_ahead"], extra["uncompiled_passes"]) == (0, False, 0)
    finally:
        engine.stop()


def test_idle_traces_wait_for_the_engine_to_stay_quiet_as_long_as_the_last_took(tiny_llama, monkeypatch):
    # A trace started between one agent's turns holds its next request for the trace's length:
    # after ready (and after each request) the engine traces only once quiet for IDLE_QUIET_S.
    monkeypatch.setattr(warmup, "IDLE_QUIET_S", 3.0)
    engine = Engine(tiny_llama, EngineConfig(prefix_cache_bytes=0, max_batch=4, speculate=False, warm_up_s=0.01,
                                             kv_budget_bytes=64 << 20, **AS_ON_A_GPU))
    engine.start()
    try:
        assert engine.ready.wait(120)
        before = engine.stats().extra["compiled_shapes"]
        assert run_alone(engine, make_prompts(tiny_llama.tokenizer, [20])[0], max_tokens=4)[0]
        assert engine.stats().extra["compiled_shapes"] == before  # nothing traced within 3 s of ready
        assert not engine.warmer.done and not engine.warmer.due(2.9) and engine.warmer.due(3.0)
        assert wait_for(lambda: engine.stats().extra["compiled_shapes"] > before, timeout=60)
    finally:
        engine.stop()


def test_after_a_trace_of_seconds_the_next_waits_as_long():
    slow = SimpleNamespace(done=False, last_trace_s=5.0)
    assert not warmup.ShapeWarmer.due(slow, 4.9) and warmup.ShapeWarmer.due(slow, 5.0)
    assert not warmup.ShapeWarmer.due(SimpleNamespace(done=True, last_trace_s=0.0), 60.0)  # nothing left


def test_what_ran_uncompiled_is_traced_first_when_the_engine_goes_idle(tiny_llama, caplog, monkeypatch):
    # Under steady traffic idle moments are few: each goes to the shape the traffic met, not to
    # the next of the likeliest-first list (which starts with one row at every cache size).
    monkeypatch.setattr(warmup, "IDLE_QUIET_S", 1.0)
    engine = Engine(tiny_llama, EngineConfig(prefix_cache_bytes=0, max_batch=4, speculate=False, warm_up_s=1e-6,
                                             kv_budget_bytes=64 << 20, **AS_ON_A_GPU))
    with caplog.at_level("DEBUG", logger="locals.engine.warmup"):
        engine.start()
        try:
            assert engine.ready.wait(120)
            prompts = make_prompts(tiny_llama.tokenizer, [300, 310, 320])  # three rows past 256 positions
            c = Collector()
            for prompt in prompts:
                c.submit(engine, GenerationRequest(prompt, SamplingParams(max_tokens=8, temperature=0)))
            c.wait()
            missed = dict(engine.runner.compiled.missed)  # the engine stays quiet 1 s before a trace
            kind, shape = max(missed, key=missed.get)
            caplog.clear()
            assert wait_for(lambda: any(r.getMessage().startswith("compiled ") for r in caplog.records), timeout=60)
            first = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("compiled "))
            assert first.startswith(f"compiled {kind} {shape if kind == 'step' else (shape,)} in"), (first, missed)
            # Met again, the shapes it traced run compiled.
            assert wait_for(lambda: not engine.runner.compiled.missed and sum(
                r.getMessage().startswith("compiled ") for r in caplog.records) >= len(missed), timeout=120)
            before = engine.stats().extra["uncompiled_passes"]
            c = Collector()
            for prompt in prompts:
                c.submit(engine, GenerationRequest(prompt, SamplingParams(max_tokens=8, temperature=0)))
            c.wait()
            assert engine.stats().extra["uncompiled_passes"] == before
        finally:
            engine.stop()
