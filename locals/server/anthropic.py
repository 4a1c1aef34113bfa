"""Anthropic Messages API: `POST /v1/messages` (plain and streamed) and `/v1/messages/count_tokens`.

Claude Code sends `?beta=true`, `thinking`, `context_management`, cache_control hints and
server tools; what is not implemented is accepted and ignored.
"""

from __future__ import annotations

import asyncio
import uuid
from contextlib import aclosing
from typing import Any

from aiohttp import web

from locals.errors import RequestError
from locals.protocol import SamplingParams, Usage
from locals.server.backend import Done, Text, Thinking, chat_of, guard_detail, start
from locals.server.wire import get, read_json, stop_list
from locals.server.messages import assistant_call, client_tools, text_of
from locals.server.state import backend_of
from locals.server.streaming import EventStream
from locals.server.thinking import asked_anthropic
from locals.server.toolcalls import ToolCall

_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "loop": "end_turn"}
_SKIPPED_BLOCKS = {"thinking", "redacted_thinking", "server_tool_use", "web_search_tool_result"}


def _blocks(content: Any, where: str) -> list[dict]:
    """A message's content (or the top-level `system`) as a list of blocks."""
    field = "`system`" if where == "system" else f"{where}.content"
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise RequestError(f"{field} must be a string or an array of content blocks")
    if not all(isinstance(b, dict) and isinstance(b.get("type"), str) for b in content):
        raise RequestError(f"{field} blocks must be objects with a string `type`")
    return content


# An image or PDF a tool returned (Claude Code's Read on a screenshot) is named, not refused: a
# refusal would stay in the conversation's history and fail every later turn.
UNSEEN = "[an image or document the tool returned: this model reads text only and cannot see it]"
_RESULT_BLOCKS = ("text", "image", "document")


def _convert_message(msg: Any, where: str) -> list[dict]:
    """One Anthropic message as template messages (tool results become `tool` messages)."""
    if not isinstance(msg, dict) or msg.get("role") not in ("user", "assistant"):
        raise RequestError(f"{where} must be an object with role user or assistant")
    texts, calls, out = [], [], []
    for block in _blocks(msg.get("content"), where):
        kind = block.get("type")
        if kind == "text":
            texts.append(text_of([block], where))
        elif kind == "tool_use" and msg["role"] == "assistant":
            calls.append(assistant_call(block.get("id"), block.get("name"), block.get("input"), where))
        elif kind == "tool_result":
            result = block.get("content")
            if isinstance(result, list):
                result = [b if b.get("type") == "text" else {"type": "text", "text": UNSEEN}
                          for b in _blocks(result, f"{where}.tool_result") if b.get("type") in _RESULT_BLOCKS]
            text = text_of(result, where)
            if block.get("is_error"):
                text = f"Error: {text}"
            call_id = block.get("tool_use_id")
            if call_id is not None and not isinstance(call_id, str):
                raise RequestError(f"{where}: a tool_result's `tool_use_id` must be a string")
            out.append({"role": "tool", "tool_call_id": call_id or "", "content": text})
        elif kind == "document":
            texts.append(_document_text(block.get("source"), where))
        elif kind == "image":
            raise RequestError(f"{where}: this model reads text only; remove the {kind} block")
        elif kind not in _SKIPPED_BLOCKS:
            raise RequestError(f"{where}: unknown content block type {kind!r}")
    if texts or calls or not out:
        item = {"role": msg["role"], "content": "".join(texts)}
        if calls:
            item["tool_calls"] = calls
        out.append(item)
    return out


def _document_text(source: Any, where: str) -> str:
    """A document block's text: a plain-text source is read; PDFs and other files are refused."""
    if not isinstance(source, dict) or source.get("type") != "text":
        raise RequestError(f"{where}: this model reads text only; a document needs a "
                           "{\"type\": \"text\", \"data\": …} source")
    data = source.get("data", "")
    if not isinstance(data, str):
        raise RequestError(f"{where}: a text document's `data` must be a string")
    return data


def chat_messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("`messages` must be a non-empty array")
    out = []
    systems = [text_of(_blocks(body["system"], "system"), "system")] if body.get("system") else []
    # Claude Code also sends `role: "system"` messages (its environment notes) among the
    # messages; chat templates want one system prompt first, so they are folded into it.
    systems += [text_of(_blocks(m.get("content"), f"messages[{i}]"), f"messages[{i}]")
                for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "system"]
    if systems:
        out.append({"role": "system", "content": "\n\n".join(s for s in systems if s)})
    names: dict[str, str] = {}
    for i, msg in enumerate(messages):
        if isinstance(msg, dict) and msg.get("role") == "system":
            continue
        for item in _convert_message(msg, f"messages[{i}]"):
            for call in item.get("tool_calls", []):
                names[call["id"]] = call["function"]["name"]
            if item["role"] == "tool":
                item["name"] = names.get(item["tool_call_id"], "")
            out.append(item)
    return out


def chat_tools(tools: Any) -> list[dict] | None:
    """Client tools; Anthropic's server tools (web search, bash_2025…) have a `type` and are skipped."""
    return client_tools(tools, lambda tool, where: None if tool.get("type") not in (None, "custom")
                        else (tool.get("name"), tool.get("description"), tool.get("input_schema")))


def tool_choice_of(value: Any) -> Any:
    if value is None:
        return "auto"
    kind = value.get("type") if isinstance(value, dict) else None
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool" and isinstance(value.get("name"), str):
        return {"type": "function", "function": {"name": value["name"]}}
    raise RequestError("`tool_choice.type` must be auto, any, tool (with a name) or none")


def _prefill(messages: list[dict]) -> bool:
    """Whether the conversation ends in the assistant's own words, which the reply continues."""
    last = messages[-1] if messages else {}
    return last.get("role") == "assistant" and bool(last.get("content")) and not last.get("tool_calls")


def _usage(usage: Usage) -> dict:
    return {"input_tokens": usage.prompt_tokens - usage.cached_tokens,
            "cache_read_input_tokens": usage.cached_tokens, "cache_creation_input_tokens": 0,
            "output_tokens": usage.completion_tokens}


def _tool_block(call: ToolCall) -> dict:
    return {"type": "tool_use", "id": f"toolu_{call.id.removeprefix('call_')}", "name": call.name,
            "input": call.arguments}


async def messages(request: web.Request) -> web.StreamResponse:
    backend = backend_of(request)
    body = await read_json(request)
    max_tokens = get(body, "max_tokens", int, backend.default_max_tokens)
    if max_tokens < 1:
        raise RequestError("`max_tokens` must be at least 1")
    converted = chat_messages(body)
    schema = _output_schema(body)  # guaranteed by Anthropic: strict, rules it cannot enforce refused
    chat = chat_of(request, body, "anthropic", messages=converted, tools=chat_tools(body.get("tools")),
                   json_schema=schema, strict_schema=schema is not None,
                   continue_final=_prefill(converted), tool_choice=tool_choice_of(body.get("tool_choice")),
                   thinking=asked_anthropic(body),
                   parallel_tool_calls=not (body.get("tool_choice") or {}).get("disable_parallel_tool_use", False),
                   sampling=SamplingParams(
                       temperature=get(body, "temperature", float, 1.0),
                       top_p=get(body, "top_p", float, 1.0), top_k=get(body, "top_k", int, 0),
                       max_tokens=max_tokens, stop=stop_list(body.get("stop_sequences"), "stop_sequences")))
    model = body.get("model") if isinstance(body.get("model"), str) else f"locals/{backend.name}"
    msg_id = f"msg_{uuid.uuid4().hex[:24]}"
    if get(body, "stream", bool, False):
        async with aclosing(await start(backend, chat)) as outputs:
            return await _stream(request, outputs, msg_id, model, chat.prompt_tokens)
    result = await backend.complete(chat)
    result.raise_for_failure()
    content = [_thinking_block(result.thinking)] if result.thinking else []
    content += [{"type": "text", "text": result.text}] if result.text else []
    content += [_tool_block(c) for c in result.calls]
    return web.json_response({"id": msg_id, "type": "message", "role": "assistant", "model": model,
                              "content": content, **_stop_fields(result.done), "usage": _usage(result.done.usage),
                              **guard_detail(result.done)})


def _output_schema(body: dict) -> dict | None:
    """The JSON schema of Anthropic's structured outputs: `output_config.format`, or the beta's
    `output_format`; None when the request asks for none."""
    config = body.get("output_config")
    fmt = config.get("format") if isinstance(config, dict) else None
    fmt = body.get("output_format") if fmt is None else fmt
    if fmt is None:
        return None
    if not (isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict)):
        raise RequestError('`output_config.format` must be {"type": "json_schema", "schema": {...}}')
    return fmt["schema"]


def _thinking_block(text: str) -> dict:
    """A thinking model's reasoning as Anthropic's `thinking` block; locals signs nothing, and
    skips such blocks when a client sends them back."""
    return {"type": "thinking", "thinking": text, "signature": ""}


def _stop_fields(done: Done) -> dict:
    """`stop_reason` and `stop_sequence`: "stop_sequence" with the string when one of the request's ended it."""
    if done.reason == "stop" and done.stop_sequence:
        return {"stop_reason": "stop_sequence", "stop_sequence": done.stop_sequence}
    return {"stop_reason": _STOP.get(done.reason, "end_turn"), "stop_sequence": None}


async def _stream(request: web.Request, outputs, msg_id: str, model: str,
                  prompt_tokens: int) -> web.StreamResponse:
    stream = await EventStream(request).open()

    async def send(kind: str, **fields) -> None:
        await stream.send({"type": kind, **fields}, event=kind)

    await send("message_start", message={
        "id": msg_id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": prompt_tokens, "output_tokens": 0}})
    await send("ping")
    outputs.keep_alive = lambda: send("ping")  # as Anthropic's own streams do while they think
    index, open_kind = 0, None  # the block being written: "text", "thinking" or None

    async def write(kind: str, delta: dict) -> None:
        nonlocal index, open_kind
        if open_kind != kind:
            if open_kind:
                await send("content_block_stop", index=index)
                index += 1
            start = {"type": "text", "text": ""} if kind == "text" else _thinking_block("")
            await send("content_block_start", index=index, content_block=start)
            open_kind = kind
        await send("content_block_delta", index=index, delta=delta)

    async for out in outputs:
        if isinstance(out, Text) and out.text:
            await write("text", {"type": "text_delta", "text": out.text})
        elif isinstance(out, Thinking):
            await write("thinking", {"type": "thinking_delta", "thinking": out.text})
        elif isinstance(out, ToolCall):
            if open_kind:
                await send("content_block_stop", index=index)
                index, open_kind = index + 1, None
            await send("content_block_start", index=index, content_block={**_tool_block(out), "input": {}})
            await send("content_block_delta", index=index,
                       delta={"type": "input_json_delta", "partial_json": out.arguments_json})
            await send("content_block_stop", index=index)
            index += 1
        elif isinstance(out, Done):
            if open_kind:
                await send("content_block_stop", index=index)
            if failure := out.failure():
                kind, message = failure
                await send("error", error={"type": "api_error" if kind == "server_error" else kind, "message": message})
            else:
                await send("message_delta", delta=_stop_fields(out), usage=_usage(out.usage),
                           **guard_detail(out))
                await send("message_stop")
    return await stream.close()


async def count_tokens(request: web.Request) -> web.Response:
    backend = backend_of(request)
    body = await read_json(request)
    converted = chat_messages(body)
    tokens = await asyncio.to_thread(backend.encode_chat, converted, chat_tools(body.get("tools")), _prefill(converted))
    return web.json_response({"input_tokens": len(tokens)})


def register(app: web.Application) -> None:
    app.router.add_post("/v1/messages", messages)
    app.router.add_post("/v1/messages/count_tokens", count_tokens)
