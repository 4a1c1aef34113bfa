"""OpenAI API: /v1/chat/completions, /v1/completions and /v1/models (Responses is in responses.py)."""

from __future__ import annotations

import os
import time
import uuid
from contextlib import aclosing
from typing import Any

from aiohttp import web

from locals.errors import RequestError
from locals.protocol import SamplingParams, TokenLogprob, Usage
from locals.server.backend import Backend, Chat, Done, Text, Thinking, chat_of, guard_detail, start
from locals.server.wire import get, read_json, stop_list
from locals.server.messages import (openai_messages, openai_tool_choice,
                                    openai_tools, schema_of_response_format,
                                    strict_response_format)
from locals.server.state import backend_of
from locals.server.streaming import EventStream
from locals.server.thinking import asked_openai
from locals.server.toolcalls import ToolCall

_FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls", "loop": "stop"}


def sampling_of(body: dict, default_max_tokens: int, legacy_logprobs: bool = False) -> SamplingParams:
    """Sampling settings shared by chat/completions/responses requests (`default_max_tokens`
    where the body names no limit); `legacy_logprobs`: /v1/completions, where `logprobs` is the
    number of alternatives rather than a flag."""
    given = [(key, get(body, key, int)) for key in ("max_completion_tokens", "max_tokens", "max_output_tokens")]
    key, max_tokens = next(((k, v) for k, v in given if v is not None), ("max_tokens", default_max_tokens))
    if max_tokens < 1:  # 0 is a value, not "absent"
        raise RequestError(f"`{key}` must be at least 1")
    logprobs_key = "logprobs" if legacy_logprobs else "top_logprobs"
    if legacy_logprobs:
        top_logprobs = get(body, "logprobs", int, None)
        wants_logprobs = top_logprobs is not None
        top_logprobs = top_logprobs or 0
    else:
        top_logprobs = get(body, "top_logprobs", int, 0)
        wants_logprobs = bool(get(body, "logprobs", bool, False)) or top_logprobs > 0
    if not 0 <= top_logprobs <= 20:
        raise RequestError(f"`{logprobs_key}` must be between 0 and 20")
    n = get(body, "n", int, 1)
    if n != 1:
        raise RequestError("`n` must be 1: one choice per request (send several requests instead)")
    refuse_unsupported_sampling(body)
    return SamplingParams(
        temperature=get(body, "temperature", float, 1.0), top_p=get(body, "top_p", float, 1.0),
        top_k=get(body, "top_k", int, 0), min_p=get(body, "min_p", float, 0.0),
        seed=get(body, "seed", int), max_tokens=max_tokens, stop=stop_list(body.get("stop")),
        logprobs=wants_logprobs, top_logprobs=top_logprobs)


def refuse_unsupported_sampling(body: dict) -> None:
    """A 400 for sampling fields that would change the reply but that locals does not apply (a
    well-typed neutral value passes: clients send `presence_penalty: 0` by default)."""
    for key in ("presence_penalty", "frequency_penalty"):
        penalty = get(body, key, float, 0.0)
        if not -2.0 <= penalty <= 2.0:
            raise RequestError(f"`{key}` must be between -2 and 2")
        if penalty:
            raise RequestError(f"`{key}` is not supported: locals samples without penalties; leave it out or send 0")
    if get(body, "logit_bias", dict, {}):
        raise RequestError("`logit_bias` is not supported: leave it out (a JSON schema or tools constrain a reply)")


def usage_json(usage: Usage) -> dict:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": 0}}


def _logprob_entry(backend: Backend, lp: TokenLogprob) -> dict:
    def one(token: int, logprob: float) -> dict:
        text = backend.token_text(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}
    return {**one(lp.token, lp.logprob), "top_logprobs": [one(t, p) for t, p in lp.top]}


def _call_json(call: ToolCall, index: int | None = None) -> dict:
    out = {"id": call.id, "type": "function",
           "function": {"name": call.name, "arguments": call.arguments_json}}
    return out if index is None else {"index": index, **out}


def model_name(body: dict, backend: Backend) -> str:
    """The model a reply names: the one the request named (any is served by the loaded model)."""
    model = body.get("model")
    return model if isinstance(model, str) and model else f"locals/{backend.name}"


def openai_chat(request: web.Request, body: dict, api: str, messages: list[dict], response_format: Any) -> Chat:
    """The Chat of an OpenAI-shaped request (Chat Completions, Responses): its `messages` and its
    `response_format` as that API carries them; tools, tool choice and sampling read alike."""
    return chat_of(request, body, api, messages=messages, tools=openai_tools(body.get("tools")),
                   tool_choice=openai_tool_choice(body.get("tool_choice")),
                   json_schema=schema_of_response_format(response_format),
                   strict_schema=strict_response_format(response_format),
                   parallel_tool_calls=get(body, "parallel_tool_calls", bool, True),
                   sampling=sampling_of(body, backend_of(request).default_max_tokens),
                   thinking=asked_openai(body, api))


async def chat_completions(request: web.Request) -> web.StreamResponse:
    backend = backend_of(request)
    body = await read_json(request)
    chat = openai_chat(request, body, "openai", openai_messages(body.get("messages")), body.get("response_format"))
    meta = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()),
            "model": model_name(body, backend)}
    if get(body, "stream", bool, False):
        options = get(body, "stream_options", dict, {})
        return await _stream_chat(request, backend, chat, meta, bool(options.get("include_usage")))
    result = await backend.complete(chat)
    result.raise_for_failure()
    message: dict[str, Any] = {"role": "assistant", "content": result.text or None}
    if result.thinking:  # a thinking model's reasoning, where vLLM and llama.cpp put it
        message["reasoning_content"] = result.thinking
    if result.calls:
        message["tool_calls"] = [_call_json(c) for c in result.calls]
    if not result.calls and message["content"] is None:
        message["content"] = ""
    choice = {"index": 0, "message": message, "finish_reason": _FINISH.get(result.done.reason, "stop"),
              "logprobs": ({"content": [_logprob_entry(backend, lp) for lp in result.logprobs]}
                           if chat.sampling.logprobs else None)}
    return web.json_response({**meta, "object": "chat.completion", "choices": [choice],
                              "usage": usage_json(result.done.usage), **guard_detail(result.done)})


async def _stream_chat(request: web.Request, backend: Backend, chat: Chat, meta: dict,
                       include_usage: bool) -> web.StreamResponse:
    async with aclosing(await start(backend, chat)) as outputs:
        stream = await EventStream(request).open()
        outputs.keep_alive = stream.comment
        await _send_chat_chunks(stream, backend, outputs, meta, include_usage)
    await stream.send("[DONE]")
    return await stream.close()


async def _send_chat_chunks(stream: EventStream, backend: Backend, outputs, meta: dict,
                            include_usage: bool) -> None:

    def chunk(delta: dict, finish: str | None = None, logprobs: Any = None) -> dict:
        return {**meta, "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "logprobs": logprobs,
                             "finish_reason": finish}]}

    await stream.send(chunk({"role": "assistant", "content": ""}))
    index = 0
    async for out in outputs:
        if isinstance(out, Text):
            lps = ({"content": [_logprob_entry(backend, lp) for lp in out.logprobs]}
                   if out.logprobs else None)
            if out.text or lps:
                await stream.send(chunk({"content": out.text}, logprobs=lps))
        elif isinstance(out, Thinking):
            await stream.send(chunk({"reasoning_content": out.text}))
        elif isinstance(out, ToolCall):
            await stream.send(chunk({"tool_calls": [_call_json(out, index)]}))
            index += 1
        elif failure := out.failure():
            await stream.send(_error_event(failure))
        else:
            await stream.send({**chunk({}, _FINISH.get(out.reason, "stop")), **guard_detail(out)})
            if include_usage:
                await stream.send({**meta, "object": "chat.completion.chunk", "choices": [],
                                   "usage": usage_json(out.usage)})


def _error_event(failure: tuple[str, str]) -> dict:
    kind, message = failure
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


async def completions(request: web.Request) -> web.StreamResponse:
    backend = backend_of(request)
    body = await read_json(request)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise RequestError("`prompt` must be a string (one prompt per request)")
    if get(body, "echo", bool, False):
        raise RequestError("`echo` is not supported: the reply is the completion alone; prepend the prompt yourself")
    if get(body, "suffix", str, ""):
        raise RequestError("`suffix` is not supported: locals completes a prompt's end, not a gap in it")
    if get(body, "best_of", int, 1) != 1:
        raise RequestError("`best_of` must be 1: one completion per request (send several requests instead)")
    sampling = sampling_of(body, backend.default_max_tokens, legacy_logprobs=True)
    chat = chat_of(request, body, "openai", prompt=prompt, sampling=sampling)
    meta = {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()),
            "model": model_name(body, backend), "object": "text_completion"}
    if get(body, "stream", bool, False):
        async with aclosing(await start(backend, chat)) as outputs:
            stream = await EventStream(request).open()
            outputs.keep_alive = stream.comment
            async for out in outputs:
                if isinstance(out, Text) and out.text:
                    logprobs = _legacy_logprobs(backend, out.logprobs) if out.logprobs else None
                    await stream.send({**meta, "choices": [{"index": 0, "text": out.text,
                                                            "logprobs": logprobs, "finish_reason": None}]})
                elif isinstance(out, Done) and out.failure():  # as the chat stream reports it
                    await stream.send(_error_event(out.failure()))
                elif isinstance(out, Done):
                    await stream.send({**meta, "usage": usage_json(out.usage), "choices": [{
                        "index": 0, "text": "", "logprobs": None,
                        "finish_reason": _FINISH.get(out.reason, "stop")}]})
        await stream.send("[DONE]")
        return await stream.close()
    result = await backend.complete(chat)
    result.raise_for_failure()
    logprobs = _legacy_logprobs(backend, result.logprobs) if sampling.logprobs else None
    return web.json_response({**meta, "choices": [{
        "index": 0, "text": result.text, "logprobs": logprobs,
        "finish_reason": _FINISH.get(result.done.reason, "stop")}],
        "usage": usage_json(result.done.usage)})


def _legacy_logprobs(backend: Backend, logprobs: list[TokenLogprob]) -> dict:
    """/v1/completions' logprobs: parallel lists of tokens, their logprobs and alternatives."""
    return {"tokens": [backend.token_text(lp.token) for lp in logprobs],
            "token_logprobs": [lp.logprob for lp in logprobs],
            "top_logprobs": [{backend.token_text(t): p for t, p in lp.top} for lp in logprobs]}


async def models(request: web.Request) -> web.Response:
    backend = backend_of(request)
    created = int(backend.activity.started)
    names = [f"locals/{backend.name}", backend.name]
    editor = getattr(backend.loaded, "editor_name", None)  # the name `locals models` gives editors
    if editor and editor not in names:
        names.insert(1, editor)
    # A repo id is a name clients know; a local folder's path is not listed (any name is served).
    if backend.model_id not in names and not os.path.isabs(backend.model_id):
        names.append(backend.model_id)
    return web.json_response({"object": "list", "data": [
        {"id": n, "object": "model", "created": created, "owned_by": "locals"} for n in names]})


async def model(request: web.Request) -> web.Response:
    """`GET /v1/models/{id}`: any name is served by the loaded model (requests ignore it), so any is found."""
    backend = backend_of(request)
    return web.json_response({"id": request.match_info["model"], "object": "model",
                              "created": int(backend.activity.started), "owned_by": "locals"})


def register(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/{model:.+}", model)
