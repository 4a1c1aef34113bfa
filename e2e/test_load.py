"""The guards under load: 64 streaming clients of mixed length against a real daemon, a third
hanging up at random points, with a KV budget small enough that requests queue.

Checks: every finished request is complete and valid; no slot is stuck afterwards; the
server's memory returns near its idle baseline; /health and the dashboard answer
throughout; a request that can never fit is refused with a clear message while the
others are served. Bounded in count and time; traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import json
import random
import time

import aiohttp
import psutil
import pytest

from locals.traffic.servers import free_port

from e2e.daemon import LocalsServer

pytestmark = pytest.mark.slow

CLIENTS = 64
KV_BUDGET_MB = 256  # SmolLM2 in float32 takes ~46 KB of KV per token: ~5,700 tokens at once
PREFIX_CACHE_MB = 256  # what the prompt cache may keep after the load (its default follows free memory)


@pytest.fixture(scope="module")
def loaded_server(tmp_path_factory, locals_server):
    home = tmp_path_factory.mktemp("load-home")
    env = {**locals_server.env, "LOCALS_HOME": str(home), "LOCALS_KV_BUDGET_MB": str(KV_BUDGET_MB),
           "LOCALS_PREFIX_CACHE_MB": str(PREFIX_CACHE_MB)}
    server = LocalsServer(port=free_port(), home=home, env=env)
    started = server.cli("start", "--model", "smollm2", "--port", str(server.port))
    assert started.returncode == 0, started.stderr
    yield server
    server.cli("stop", "--port", str(server.port), timeout=60)


def _body(rng: random.Random, i: int) -> dict:
    words = " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "code", "test", "file"])
                     for _ in range(rng.randint(5, 300)))
    return {"model": "any", "stream": True, "temperature": 0.8, "seed": i,
            "max_tokens": rng.randint(4, 48), "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": f"Client {i}: summarize: {words}"}]}


async def _client(session, url: str, body: dict, hang_up_after: int | None) -> dict:
    """One streaming client; returns what it saw."""
    chunks, finish, usage, text = 0, None, None, ""
    async with session.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            data = json.loads(line[5:])
            chunks += 1
            if data.get("usage"):
                usage = data["usage"]
            for choice in data.get("choices", []):
                text += choice.get("delta", {}).get("content") or ""
                finish = choice.get("finish_reason") or finish
            if hang_up_after is not None and chunks >= hang_up_after:
                return {"hung_up": True}
    return {"hung_up": False, "finish": finish, "usage": usage, "text": text, "max": body["max_tokens"]}


async def _watch(server: LocalsServer, stop: asyncio.Event, failures: list[str]) -> int:
    """Poll /health and the dashboard while the load runs; count answers."""
    answered = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        while not stop.is_set():
            for path, headers in (("/health", {}), ("/", {"Accept": "text/html"})):
                try:
                    async with session.get(server.url + path, headers=headers) as resp:
                        if resp.status != 200:
                            failures.append(f"{path}: {resp.status}")
                        answered += 1
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    failures.append(f"{path}: {exc!r}")
            await asyncio.sleep(0.5)
    return answered


async def _load(server: LocalsServer) -> tuple[list[dict], int, list[str]]:
    rng = random.Random(7)
    url = server.openai_url + "/chat/completions"
    hang = {i: rng.randint(1, 6) for i in rng.sample(range(CLIENTS), CLIENTS // 3)}
    stop, failures = asyncio.Event(), []
    watcher = asyncio.create_task(_watch(server, stop, failures))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
        results = await asyncio.gather(*[_client(session, url, _body(rng, i), hang.get(i))
                                         for i in range(CLIENTS)])
    stop.set()
    return results, await watcher, failures


def _rss(server: LocalsServer) -> int:
    return psutil.Process(server.get_json("/health")["pid"]).memory_info().rss


def _settled_rss(server: LocalsServer, bound: float, timeout: float = 20) -> int:
    """RSS once it is under `bound` or `timeout` has passed: the engine gives freed memory
    back on its first idle loop turn, a moment after its status first reads idle."""
    deadline = time.time() + timeout
    while (rss := _rss(server)) > bound and time.time() < deadline:
        time.sleep(0.5)
    return rss


def _wait_idle(server: LocalsServer, timeout: float = 60) -> dict:
    deadline = time.time() + timeout
    while True:
        status = server.get_json("/v1/locals/status")
        engine = status.get("engine", status)
        if (engine.get("running", 0), engine.get("waiting", 0)) == (0, 0) or time.time() > deadline:
            return engine
        time.sleep(0.5)


def test_64_clients_with_hang_ups(loaded_server):
    server = loaded_server
    warm = asyncio.run(_load_one(server))
    assert warm["finish"] in ("stop", "length")
    baseline = _rss(server)
    start = time.time()
    results, answered, failures = asyncio.run(_load(server))
    assert time.time() - start < 900
    finished = [r for r in results if not r["hung_up"]]
    assert len(finished) >= CLIENTS - CLIENTS // 3
    for r in finished:
        assert r["finish"] in ("stop", "length"), r
        assert r["usage"]["completion_tokens"] <= r["max"]
        assert r["text"].encode("utf-8").decode("utf-8") == r["text"]
    assert answered > 0 and not failures, failures
    idle = _wait_idle(server)
    assert idle.get("running", 0) == 0 and idle.get("waiting", 0) == 0, idle
    assert server.get_json("/v1/locals/status")["requests"]["in_flight"] == 0
    # Memory: the KV of every request is gone; the prefix cache may keep a bounded amount.
    bound = baseline * 1.10 + PREFIX_CACHE_MB * 2**20
    assert _settled_rss(server, bound) <= bound, (baseline, _rss(server))


async def _load_one(server: LocalsServer) -> dict:
    async with aiohttp.ClientSession() as session:
        return await _client(session, server.openai_url + "/chat/completions",
                             _body(random.Random(1), 1000), None)


def test_request_that_can_never_fit_is_refused_and_others_served(loaded_server):
    server = loaded_server

    async def both():
        async with aiohttp.ClientSession() as session:
            big = {"model": "any", "max_tokens": 7000, "messages": [{"role": "user", "content": "write a book"}]}
            async with session.post(server.openai_url + "/chat/completions", json=big) as resp:
                refused = (resp.status, await resp.json())
            ok = await _client(session, server.openai_url + "/chat/completions", _body(random.Random(2), 2001), None)
        return refused, ok

    (status, body), ok = asyncio.run(both())
    assert status in (413, 429), body
    assert "max_tokens" in body["error"]["message"]
    assert ok["finish"] in ("stop", "length")
