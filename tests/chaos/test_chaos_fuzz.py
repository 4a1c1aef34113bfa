"""Fuzzed requests against the app in-process on a scripted engine: a few hundred hostile
bodies over every endpoint, each answered with a 4xx in the API's error shape or a valid
reply, and the server still serving after each batch. The slow variant, against a real
daemon on the embedded model with 5,000 bodies, is test_chaos_fuzz_daemon.py.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.chaos.chaos_bodies import ENDPOINTS, request_case
from tests.chaos.chaos_checks import error_shape_ok, post_lying_length
from tests.chaos.fuzz_driver import FuzzDriver


BATCH = 8
FAST_BATCHES = 40  # 320 bodies: a few seconds in-process


@pytest.fixture
def driver(app_server):
    driver = FuzzDriver(app_server.url)
    yield driver
    driver.close()


def test_fuzzed_bodies_get_a_4xx_or_a_reply(driver):
    @settings(max_examples=FAST_BATCHES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(request_case(), min_size=BATCH, max_size=BATCH))
    def one_batch(cases):
        assert driver.batch(cases) == []

    one_batch()
    assert driver.tally.sent >= FAST_BATCHES * BATCH


@pytest.mark.parametrize("endpoint", ENDPOINTS[:8], ids=lambda e: e.path)
def test_a_content_length_shorter_than_the_body_gets_a_400(app_server, endpoint):
    """The server reads what was declared (a cut-off JSON body) and the rest is not HTTP: a 400
    from the API, or from the HTTP layer (plain text) when the rest arrived with it."""
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "prompt": "hi"}'
    answer = post_lying_length(app_server.port, endpoint.path, body, declared=len(body) // 2,
                               wait_s=10)
    assert answer.status == 400
    if "json" in answer.content_type:
        assert error_shape_ok(endpoint.api, json.loads(answer.body))
    assert app_server.engine.requests == []


@pytest.mark.parametrize("endpoint", ENDPOINTS[:8], ids=lambda e: e.path)
def test_a_content_length_longer_than_the_body_leaves_the_server_serving(app_server, endpoint):
    """The server waits for bytes that never come (it cannot know they will not); the client
    gives up, and the next client is served."""
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    answer = post_lying_length(app_server.port, endpoint.path, body, declared=len(body) + 100,
                               wait_s=1)
    assert answer.status == 0
    driver = FuzzDriver(app_server.url)
    try:
        assert driver.batch([]) == []
    finally:
        driver.close()
