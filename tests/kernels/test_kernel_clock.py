"""Tuning's timers: device stamps are CUDA-only, chains can start after a given array, and
device-timed tuning charges a candidate for the extra kernels each call queues."""

from __future__ import annotations

import itertools

import mlx.core as mx
import pytest

from locals.engine.kernels.tuning import clock
from locals.engine.kernels.reference import cold_problems, quantized_matmul, rotating
from locals.engine.kernels.tuning.tuner import HOST_US_PER_LAUNCH, MLX_OP, Problem, tune

SMALL_SHAPES = ((33, 128), (7, 192))


def test_device_stamps_are_for_cuda_only():
    # On the CPU and Metal tuning keeps the host clock; on CUDA the stamp kernel must run.
    from locals.engine.load.backend import detect

    assert (clock.timer(mx.float32) is not None) == (detect().kind == "cuda")


def test_a_chain_fits_one_cuda_graph(monkeypatch):
    monkeypatch.delenv("MLX_MAX_OPS_PER_BUFFER", raising=False)
    assert clock.calls_per_graph() == (clock.MLX_NODES_PER_GRAPH - 2) // clock.NODES_PER_CALL == 6
    monkeypatch.setenv("MLX_MAX_OPS_PER_BUFFER", "100")
    assert clock.calls_per_graph() == 32
    monkeypatch.setenv("MLX_MAX_OPS_PER_BUFFER", "3")
    assert clock.calls_per_graph() == 1


def test_a_timed_chain_waits_for_the_array_it_is_given():
    # The first call of a sample waits for the opening stamp: a NaN there reaches its input.
    x, copies = cold_problems(2, 64, 128, 4, 64, mx.float32, cold_bytes=1)
    call = rotating(quantized_matmul, x, copies, 64, 4)
    assert mx.isnan(call(after=mx.array([mx.nan]))).all().item()
    assert mx.isnan(call()).all().item()  # the next call waits for that one
    clean = rotating(quantized_matmul, x, copies, 64, 4)
    assert mx.allclose(clean(after=mx.zeros((1,))), quantized_matmul(x, *copies[0], 64, 4)).item()


def test_functions_sharing_a_turn_take_the_copies_in_turn():
    # Timing alternates candidates; with one shared turn none re-reads the copy another just read.
    x, copies = cold_problems(1, 16, 64, 4, 64, mx.float32, cold_bytes=1 << 20)
    seen = []

    def fn(x_, w, s, b, g, bits):
        seen.append(next(i for i, c in enumerate(copies) if c[0] is w))
        return quantized_matmul(x_, w, s, b, g, bits)
    turn = itertools.cycle(copies)
    a, b = rotating(fn, x, copies, 64, 4, turn), rotating(fn, x, copies, 64, 4, turn)
    a(), b(), a(), b()
    assert len(copies) > 4 and seen == [0, 1, 2, 3]


class _Timed:
    """A correct candidate that a fake device timer reports at `us` per call."""

    def __init__(self, name: str, launches: int, calls: list):
        self.name, self.launches, self._calls = name, launches, calls

    def supports(self, rows, bits, group_size, dtype, scales_dtype):
        return True

    def __call__(self, x, w, scales, biases, group_size, bits):
        self._calls.append(self.name)
        return quantized_matmul(x, w, scales, biases, group_size, bits)


@pytest.mark.parametrize("split_us,expected", [(12.0, "plain"), (3.0, "split")])
def test_device_timed_tuning_charges_each_extra_launch(monkeypatch, split_us, expected):
    # A two-kernel call must save more device time than the host spends queuing its second
    # kernel; the table keeps the measured device times as they were.
    calls: list[str] = []
    times = {"split": split_us, "plain": 15.0, MLX_OP: 30.0}

    def fake_device_timer(fn, n):
        calls.clear()
        fn()
        return times[calls[-1] if calls else MLX_OP] * 1e-6
    monkeypatch.setattr(clock, "timer", lambda dtype: fake_device_timer)
    problem = Problem(33, 128, 4, 64, "float32")  # MLX's bfloat16 op may miss the verifier's bfloat16 limit
    table = tune([problem], rows=[2], candidates=[_Timed("split", 2, calls), _Timed("plain", 1, calls)],
                 rounds=1, repeats=1, screen_shapes=SMALL_SHAPES)
    assert table.choice(problem.key, 2) == expected
    assert table.timings_us[problem.key]["2"] == times
    assert (split_us + HOST_US_PER_LAUNCH < 15.0) == (expected == "split")
