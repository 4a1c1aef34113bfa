"""Fuzzed requests against a real daemon on the embedded model (slow): over 5,000 hostile
bodies across every endpoint, sent 8 at a time, then lying Content-Length headers. No 5xx,
no dropped connection; after each batch the daemon is healthy and answers a normal chat;
at the end nothing is left running or queued. Replies are capped (`--max-tokens 8`) so the
valid bodies among them cost a CPU little.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.chaos.chaos_bodies import ENDPOINTS, request_case
from tests.chaos.chaos_checks import post_lying_length
from tests.chaos.fuzz_driver import FuzzDriver


BATCH = 8


def _fuzz(driver: FuzzDriver, batches: int) -> None:
    @settings(max_examples=batches, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(request_case(), min_size=BATCH, max_size=BATCH))
    def one_batch(cases):
        driver.batch(cases)  # problems are gathered, not raised: the run reports them all

    one_batch()


def _lying_lengths(daemon) -> list[str]:
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "prompt": "hi"}'
    problems = []
    for endpoint in ENDPOINTS:
        short = post_lying_length(daemon.port, endpoint.path, body, len(body) // 2, wait_s=30)
        if short.status != 400:
            problems.append(f"{endpoint.path}: a short Content-Length got {short.status}")
        long = post_lying_length(daemon.port, endpoint.path, body, len(body) + 100, wait_s=1)
        if long.status >= 500:
            problems.append(f"{endpoint.path}: a long Content-Length got {long.status}")
    return problems


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.timeout(0)  # tens of minutes on a CPU
def test_fuzzed_bodies_against_a_daemon(daemons, tmp_path, request):
    batches = request.config.getoption("--fuzz-batches", 640)  # 5,120 bodies unless told
    daemon = daemons(tmp_path / "home", "--max-tokens", "8")
    driver = FuzzDriver(daemon.url)
    try:
        _fuzz(driver, batches)
        driver.tally.problems += _lying_lengths(daemon)
        driver.tally.problems += driver.batch([])  # still serving after the lying headers
    finally:
        driver.close()
    print(f"\nfuzzed daemon: {driver.tally.summary()}")
    assert driver.tally.sent >= batches * BATCH
    assert driver.tally.problems == [], "\n".join(driver.tally.problems[:20])
    assert _engine_goes_idle(daemon), "requests were left running or queued"


def _engine_goes_idle(daemon, within_s: float = 30) -> bool:
    """The last reply is out before its row leaves the batch: give the engine a moment."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        engine = daemon.get_json("/v1/locals/status")["engine"]
        if engine["running"] + engine["waiting"] + engine["prefilling"] == 0:
            return True
        time.sleep(0.5)
    return False
