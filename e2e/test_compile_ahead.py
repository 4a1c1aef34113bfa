"""No request waits on a compile. A real daemon on the embedded model that compiles short passes
(a GPU's) compiles its decode-step shapes ahead: once it says it has compiled them all, requests at
many prompt lengths and batch sizes find every pass's graph ready (none traced while they wait,
none run uncompiled for want of one). On the CPU the engine compiles nothing (forward/choices.py):
its status says so from the start, and still does after the same requests."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from locals.engine.load.backend import detect
from locals.traffic.servers import free_port

from e2e.daemon import MODEL, LocalsServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
WARM_TIMEOUT_S = 900


def _engine(server: LocalsServer) -> dict:
    return (server.get_json("/v1/locals/status").get("engine") or {}).get("extra") or {}


def _chat(server: LocalsServer, words: int, max_tokens: int) -> dict:
    text = " ".join(f"word{i % 97}" for i in range(words))
    body = {"model": "any", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0}
    req = urllib.request.Request(server.openai_url + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())


@pytest.fixture
def small_batch_server(tmp_path) -> LocalsServer:
    """A daemon of its own with at most 4 rows a step (fewer shapes to compile on two cores)."""
    env = {**os.environ, "LOCALS_HOME": str(tmp_path / "home"), "LOCALS_MAX_BATCH": "4", "HF_HUB_OFFLINE": "1",
           "NO_COLOR": "1"}
    server = LocalsServer(port=free_port(), home=tmp_path / "home", env=env)
    started = server.cli("start", "--model", MODEL, "--port", str(server.port))
    assert started.returncode == 0, started.stdout + started.stderr
    yield server
    server.cli("stop", "--port", str(server.port), timeout=60)


def test_no_request_waits_on_a_compile(small_batch_server):
    server = small_batch_server
    deadline = time.monotonic() + WARM_TIMEOUT_S
    while _engine(server).get("compiling_ahead", True):
        assert time.monotonic() < deadline, f"still compiling after {WARM_TIMEOUT_S} s: {_engine(server)}"
        time.sleep(2)
    before = _engine(server)
    compiles = detect().kind != "cpu"
    assert (before["compiled_shapes"] > 0) == compiles and before["uncompiled_passes"] == 0, before
    # Prompts of many lengths (each crossing its own token capacities as it decodes), one to four
    # at a time: every shape a step can take on this server. Where nothing compiles, fewer and
    # shorter ones show that nothing starts to (a 1,400-word prompt takes minutes on two cores).
    groups = ([3], [130], [1400], [40, 700], [260, 390, 1000], [3, 130, 390, 700]) if compiles else \
        ([3], [130], [40, 260], [3, 130, 390])
    for group in groups:
        with ThreadPoolExecutor(len(group)) as pool:  # one to four requests at once
            replies = list(pool.map(lambda n: _chat(server, n, 12), group))
        assert all(r["usage"]["completion_tokens"] > 0 for r in replies)
    after = _engine(server)
    assert after["uncompiled_passes"] == 0 and after["compiled_shapes"] == before["compiled_shapes"], after
    log = (server.home / "log").rglob("*.log")
    text = "\n".join(p.read_text(errors="replace") for p in log)
    assert ("compiled every decode-step shape" in text) == compiles
