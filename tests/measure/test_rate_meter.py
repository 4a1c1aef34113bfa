"""RateMeter: tokens per second counted from when each step started, over a sliding window."""

from locals.engine.stats import RateMeter


def test_one_long_step_is_its_tokens_over_its_own_time():
    meter = RateMeter(window=5.0)
    meter.add(335, now=107.6, started=100.0)  # a prompt read in one 7.6 s step
    assert abs(meter.rate(now=107.6) - 335 / 7.6) < 1e-9
    assert meter.rate(now=112.7) == 0.0  # the step ended more than a window ago


def test_overlapping_steps_count_from_the_first_start_and_empty_steps_are_ignored():
    meter = RateMeter(window=5.0)
    for i in range(10):  # pipelined: each step starts before the one before it is read
        meter.add(8, now=10.0 + 0.1 * (i + 1), started=10.0 + 0.1 * i - 0.05)
        meter.add(0, now=10.0 + 0.1 * (i + 1), started=9.0)  # a decode step reads no prompt
    assert abs(meter.rate(now=11.0) - 80 / 1.05) < 1e-9


def test_an_event_without_a_start_counts_from_its_end():
    meter = RateMeter(window=2.0)
    meter.add(10, now=5.0)
    meter.add(10, now=6.0)
    assert abs(meter.rate(now=7.0) - 20 / 2.0) < 1e-9
    assert abs(meter.rate(now=7.5) - 10 / 1.5) < 1e-9  # the first ended over 2 s ago
