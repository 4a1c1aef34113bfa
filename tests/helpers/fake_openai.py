"""A scripted OpenAI-compatible endpoint for tests: deterministic replies and tool calls.

A script is a function from the request body to a reply dict (`text(...)`, `calls(...)`).
Serves `/v1/chat/completions` (JSON or SSE stream) and `/v1/models`; records every request.
Use `async with FakeOpenAI(script) as url` in async tests or `with fake.in_thread() as url`
when the code under test runs its own event loop (e.g. a CLI command).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
import time
from typing import Any, Callable

from aiohttp import web

Script = Callable[[dict[str, Any]], dict[str, Any]]


def text(content: str) -> dict[str, Any]:
    """A reply with plain text and no tool call."""
    return {"content": content, "tool_calls": []}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    """One tool call, for `calls(...)`."""
    return {"name": name, "arguments": arguments}


def calls(*tool_calls: dict[str, Any], content: str = "") -> dict[str, Any]:
    """A reply made of tool calls."""
    return {"content": content, "tool_calls": list(tool_calls)}


def cut(name: str) -> dict[str, Any]:
    """A reply whose call to `name` max_tokens cut off, as locals returns it: no call, finish
    reason "length", `locals.cut_tool_call` naming it."""
    return {"content": "", "tool_calls": [], "cut": name}


def turn(body: dict[str, Any]) -> int:
    """How many assistant replies the conversation already has (0 on the first request)."""
    return sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")


class FakeOpenAI:
    """The endpoint; `requests` holds every chat body received, in order."""

    def __init__(self, script: Script, model: str = "fake-model", delay_s: float = 0.0):
        self.script = script
        self.model = model
        self.delay_s = delay_s
        self.requests: list[dict[str, Any]] = []
        self.cancelled = 0
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.url = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        return app

    async def start(self) -> str:
        # Cancel handlers when the client hangs up, as a real server frees a slot.
        self._runner = web.AppRunner(self.app(), handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> str:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @contextlib.contextmanager
    def in_thread(self):
        """Serve from a background thread's event loop; yields the base URL."""
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        thread = threading.Thread(target=self._serve_forever, args=(loop, ready), daemon=True)
        thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake OpenAI server did not start")
        try:
            yield self.url
        finally:
            asyncio.run_coroutine_threadsafe(self.stop(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)

    def _serve_forever(self, loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(self.start())
        ready.set()
        loop.run_forever()

    async def _models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
        except asyncio.CancelledError:
            self.cancelled += 1  # the client hung up while waiting
            raise
        reply = self.script(body)
        message, finish = self._message(reply)
        usage = {"prompt_tokens": sum(len(str(m.get("content") or "")) // 4 for m in body.get("messages", [])),
                 "completion_tokens": 10, "total_tokens": 0}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        if body.get("stream"):
            return await self._stream(request, message, finish, usage)
        return web.json_response({
            "id": f"chatcmpl-{next(self._ids)}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", self.model),
            "choices": [{"index": 0, "message": message, "finish_reason": "length" if reply.get("cut") else finish}],
            "usage": usage, **({"locals": {"cut_tool_call": reply["cut"]}} if reply.get("cut") else {}),
        })

    def _message(self, reply: dict[str, Any]) -> tuple[dict[str, Any], str]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.get("content") or None}
        tool_calls = [
            {"id": f"call_{next(self._ids)}", "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
            for c in reply.get("tool_calls") or []
        ]
        if tool_calls:
            message["tool_calls"] = tool_calls
        return message, "tool_calls" if tool_calls else "stop"

    async def _stream(self, request: web.Request, message: dict[str, Any], finish: str,
                      usage: dict[str, int]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        base = {"id": f"chatcmpl-{next(self._ids)}", "object": "chat.completion.chunk", "model": self.model}
        delta: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
        if message.get("tool_calls"):
            delta["tool_calls"] = [dict(tc, index=i) for i, tc in enumerate(message["tool_calls"])]
        for choice in ({"index": 0, "delta": delta, "finish_reason": None},
                       {"index": 0, "delta": {}, "finish_reason": finish}):
            await resp.write(f"data: {json.dumps(dict(base, choices=[choice]))}\n\n".encode())
        await resp.write(f"data: {json.dumps(dict(base, choices=[], usage=usage))}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp
