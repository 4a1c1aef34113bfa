"""Ollama API: /api/chat and /api/generate (NDJSON streamed by default), /api/tags, /api/show,
/api/ps, /api/version. Whatever model name a client asks for is served by the loaded model.
"""

from __future__ import annotations

import time
from contextlib import aclosing
from datetime import datetime, timezone
from typing import Any

from aiohttp import web

from locals.errors import RequestError
from locals.protocol import SamplingParams
from locals.server.backend import Backend, Chat, Done, Text, Thinking, chat_of, guard_detail, start
from locals.server.wire import get, read_json, stop_list
from locals.server.messages import assistant_call, openai_tools, text_of
from locals.server.state import backend_of
from locals.server.streaming import EventStream
from locals.server.thinking import asked_ollama
from locals.server.toolcalls import ToolCall

# The Ollama API version whose shapes these handlers follow; clients compare it, not ours.
OLLAMA_VERSION = "0.12.0"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _sampling(body: dict, default_max_tokens: int) -> SamplingParams:
    opts = get(body, "options", dict, {})
    max_tokens = get(opts, "num_predict", int, default_max_tokens)
    return SamplingParams(
        temperature=get(opts, "temperature", float, 0.8), top_p=get(opts, "top_p", float, 0.9),
        top_k=get(opts, "top_k", int, 40), min_p=get(opts, "min_p", float, 0.0),
        seed=get(opts, "seed", int), stop=stop_list(opts.get("stop")),
        max_tokens=default_max_tokens if max_tokens < 0 else max(1, max_tokens))


def _format_schema(value: Any) -> dict | None:
    if value in (None, ""):
        return None
    if value == "json":
        return {"type": "object"}
    if isinstance(value, dict):
        return value
    raise RequestError('`format` must be "json" or a JSON schema object')


def _messages(value: Any) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise RequestError("`messages` must be a non-empty array")
    out = []
    for i, msg in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(msg, dict) or msg.get("role") not in ("system", "user", "assistant", "tool"):
            raise RequestError(f"{where} must be an object with role system, user, assistant or tool")
        if msg.get("images"):
            raise RequestError(f"{where}: this model reads text only; remove `images`")
        item = {"role": msg["role"], "content": text_of(msg.get("content"), where)}
        calls = msg.get("tool_calls")
        if calls and msg["role"] == "assistant":
            if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("function"), dict)
                                                      for c in calls):
                raise RequestError(f"{where}.tool_calls must be an array of {{\"function\": {{...}}}} objects")
            item["tool_calls"] = [assistant_call(c.get("id"), c["function"].get("name"), c["function"].get("arguments"),
                                                 where) for c in calls]
        if msg["role"] == "tool":
            item["name"] = msg.get("tool_name") or msg.get("name") or ""
        out.append(item)
    return out


def _final(model: str, done: Done, started: float, key: str) -> dict:
    total = int((time.time() - started) * 1e9)
    prompt = min(int(done.prompt_s * 1e9), total)
    # The model is loaded once when the server starts: no request waits for a load.
    out = {"model": model, "created_at": _now(), "done": True,
           "done_reason": {"length": "length"}.get(done.reason, "stop"),
           "total_duration": total, "load_duration": 0,
           "prompt_eval_count": done.usage.prompt_tokens, "prompt_eval_duration": prompt,
           "eval_count": done.usage.completion_tokens, "eval_duration": total - prompt, **guard_detail(done)}
    if key == "message":
        out["message"] = {"role": "assistant", "content": ""}
    else:
        out["response"] = ""
    return out


def _call_json(call: ToolCall) -> dict:
    return {"id": call.id, "function": {"name": call.name, "arguments": call.arguments}}


async def _reply(request: web.Request, backend: Backend, chat: Chat, model: str,
                 stream: bool, key: str) -> web.StreamResponse:
    """Shared by /api/chat (key "message") and /api/generate (key "response")."""
    started = time.time()
    if not stream:
        result = await backend.complete(chat)
        result.raise_for_failure()
        out = _final(model, result.done, started, key)
        if key == "message":
            out["message"]["content"] = result.text
            if result.thinking:
                out["message"]["thinking"] = result.thinking
            if result.calls:
                out["message"]["tool_calls"] = [_call_json(c) for c in result.calls]
        else:
            out["response"] = result.text
            if result.thinking:
                out["thinking"] = result.thinking
        return web.json_response(out)
    async with aclosing(await start(backend, chat)) as outputs:
        lines = await EventStream(request, ndjson=True).open()
        outputs.keep_alive = lambda: lines.send(_piece(model, key, ""))  # an empty piece, as NDJSON has no comments
        async for out in outputs:
            await _send_line(lines, out, model, key, started)
    return await lines.close()


def _piece(model: str, key: str, content: str, calls: list | None = None, thinking: str = "") -> dict:
    """One streamed line of a reply that is not done: `message` (chat) or `response` (generate);
    a thinking model's reasoning in `thinking`, as Ollama's own."""
    body = {"role": "assistant", "content": content}
    if calls:
        body["tool_calls"] = calls
    if thinking and key == "message":
        body["thinking"] = thinking
    line = {"model": model, "created_at": _now(), key: body if key == "message" else content, "done": False}
    if thinking and key != "message":
        line["thinking"] = thinking
    return line


async def _send_line(lines: EventStream, out, model: str, key: str, started: float) -> None:
    if isinstance(out, Text) and out.text:
        await lines.send(_piece(model, key, out.text))
    elif isinstance(out, Thinking):
        await lines.send(_piece(model, key, "", thinking=out.text))
    elif isinstance(out, ToolCall):
        await lines.send(_piece(model, key, "", [_call_json(out)]))
    elif isinstance(out, Done):
        if failure := out.failure():
            await lines.send({"error": failure[1]})
        else:
            await lines.send(_final(model, out, started, key))


def _model(body: dict, backend: Backend) -> str:
    model = body.get("model")
    return model if isinstance(model, str) and model else f"{backend.name}:latest"


def _load_reply(body: dict, model: str, key: str) -> web.Response:
    """Ollama's answer to a request with nothing to generate: load the model (it is loaded
    once, at start), or with `keep_alive: 0` unload it (it stays: other agents use it)."""
    reason = "unload" if body.get("keep_alive") in (0, "0", "0s", "0m") else "load"
    content = {"role": "assistant", "content": ""} if key == "message" else ""
    return web.json_response({"model": model, "created_at": _now(), key: content, "done": True,
                              "done_reason": reason})


async def chat(request: web.Request) -> web.StreamResponse:
    backend = backend_of(request)
    body = await read_json(request)
    sampling = _sampling(body, backend.default_max_tokens)  # a malformed `options` is a 400 even with nothing to generate
    if body.get("messages") in (None, []):  # `ollama run` preloads with an empty chat
        return _load_reply(body, _model(body, backend), "message")
    request_chat = chat_of(request, body, "ollama", messages=_messages(body.get("messages")),
                           tools=openai_tools(body.get("tools")), json_schema=_format_schema(body.get("format")),
                           sampling=sampling, thinking=asked_ollama(body, backend.loaded))
    return await _reply(request, backend, request_chat, _model(body, backend),
                        get(body, "stream", bool, True), "message")


async def generate(request: web.Request) -> web.StreamResponse:
    backend = backend_of(request)
    body = await read_json(request)
    prompt = get(body, "prompt", str, "")
    model = _model(body, backend)
    if body.get("images"):
        raise RequestError("this model reads text only; remove `images`")
    if get(body, "suffix", str, ""):
        raise RequestError("`suffix` is not supported: locals completes a prompt's end, not a gap in it")
    if not prompt:  # Ollama's way to ask for the model to be loaded
        return _load_reply(body, model, "response")
    if get(body, "raw", bool, False):
        request_chat = chat_of(request, body, "ollama", prompt=prompt, sampling=_sampling(body, backend.default_max_tokens),
                               json_schema=_format_schema(body.get("format")))
    else:
        messages = [{"role": "user", "content": prompt}]
        if get(body, "system", str):
            messages.insert(0, {"role": "system", "content": body["system"]})
        request_chat = chat_of(request, body, "ollama", messages=messages, sampling=_sampling(body, backend.default_max_tokens),
                               json_schema=_format_schema(body.get("format")), thinking=asked_ollama(body, backend.loaded))
    return await _reply(request, backend, request_chat, model, get(body, "stream", bool, True),
                        "response")


def _details(backend: Backend) -> dict:
    return {"parent_model": "", "format": "mlx", "family": backend.name, "families": [backend.name],
            "parameter_size": "", "quantization_level": ""}


def _entry(backend: Backend) -> dict:
    stats = backend.stats()
    return {"name": f"{backend.name}:latest", "model": f"{backend.name}:latest",
            "modified_at": _now(), "size": stats.weights_bytes, "digest": "",
            "details": _details(backend)}


async def tags(request: web.Request) -> web.Response:
    return web.json_response({"models": [_entry(backend_of(request))]})


async def ps(request: web.Request) -> web.Response:
    backend = backend_of(request)
    entry = _entry(backend)
    entry.update(expires_at="9999-12-31T23:59:59Z", size_vram=entry["size"],
                 context_length=backend.context_length)
    return web.json_response({"models": [entry]})


async def show(request: web.Request) -> web.Response:
    backend = backend_of(request)
    await read_json(request)
    capabilities = ["completion", "tools"]  # tools are rendered into the prompt for every model
    return web.json_response({
        "license": "", "modelfile": f"FROM {backend.model_id}\n", "parameters": "", "template": "",
        "details": _details(backend), "capabilities": capabilities, "modified_at": _now(),
        "model_info": {"general.architecture": backend.name,
                       f"{backend.name}.context_length": backend.context_length}})


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": OLLAMA_VERSION})


def register(app: web.Application) -> None:
    app.router.add_post("/api/chat", chat)
    app.router.add_post("/api/generate", generate)
    app.router.add_get("/api/tags", tags)
    app.router.add_get("/api/ps", ps)
    app.router.add_post("/api/show", show)
    app.router.add_get("/api/version", version)
