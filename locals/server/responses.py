"""OpenAI Responses API (`POST /v1/responses`), the only API Codex speaks: input items in,
output items out, streamed as `response.*` events. Stateless: `store` is not kept, and a
`previous_response_id` is refused (Codex sends the whole conversation each turn).
"""

from __future__ import annotations

import time
import uuid
from contextlib import aclosing
from typing import Any

from aiohttp import web

from locals.errors import RequestError
from locals.protocol import Usage
from locals.server.backend import Chat, Completion, Done, Text, Thinking, guard_detail, start
from locals.server.wire import get, read_json
from locals.server.messages import assistant_call, text_of
from locals.server.openai import model_name, openai_chat
from locals.server.state import backend_of
from locals.server.streaming import EventStream
from locals.server.toolcalls import ToolCall


def _output_text(item: Any) -> str:
    return item if isinstance(item, str) else text_of(item, "function_call_output.output")


def input_messages(body: dict) -> list[dict]:
    """`instructions` + `input` (a string or a list of items) as template messages."""
    if get(body, "previous_response_id", str):
        raise RequestError("`previous_response_id` is not supported: locals keeps no responses; send the whole "
                           "conversation in `input`")
    messages: list[dict] = []
    instructions = get(body, "instructions", str)
    if instructions:
        messages.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        return messages + [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise RequestError("`input` must be a string or an array of items")
    names: dict[str, str] = {}
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise RequestError(f"{where} must be an object")
        kind = item.get("type", "message")
        if not isinstance(kind, str):
            raise RequestError(f"{where}.type must be a string")
        if kind == "message":
            role = item.get("role")
            role = "system" if role == "developer" else role
            if not isinstance(role, str) or role not in ("system", "user", "assistant"):
                raise RequestError(f"{where}.role must be system, developer, user or assistant")
            messages.append({"role": role, "content": text_of(item.get("content"), where)})
        elif kind in ("function_call", "custom_tool_call"):
            args = item.get("arguments") if kind == "function_call" else {"input": item.get("input", "")}
            call = assistant_call(item.get("call_id"), item.get("name"), args, where)
            names[item.get("call_id")] = item.get("name")
            if messages and messages[-1]["role"] == "assistant" and not messages[-1]["content"]:
                messages[-1].setdefault("tool_calls", []).append(call)  # parallel calls, one turn
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            call_id = item.get("call_id")
            if call_id is not None and not isinstance(call_id, str):
                raise RequestError(f"{where}.call_id must be a string")
            messages.append({"role": "tool", "tool_call_id": call_id or "", "name": names.get(call_id, ""),
                             "content": _output_text(item.get("output"))})
        elif "role" in item:  # a message under a misspelt type would be lost: say so
            raise RequestError(f"{where}: unknown input item type {kind!r}; a message's type is \"message\"")
        # reasoning, web_search_call and other items carry nothing the model reads again
    if not messages:
        raise RequestError("`input` is empty; send at least one message")
    return messages


def _usage(usage: Usage) -> dict:
    return {"input_tokens": usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": usage.cached_tokens},
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": usage.total_tokens}


def _message_item(item_id: str, text: str, status: str = "completed") -> dict:
    """An assistant message item; one still in progress starts with no content parts."""
    parts = [] if status == "in_progress" else [{"type": "output_text", "text": text, "annotations": []}]
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": parts}


def _reasoning_item(item_id: str, text: str, status: str = "completed") -> dict:
    """A thinking model's reasoning, as a reasoning item with its text (as OpenAI's open-weight
    models give theirs)."""
    content = [] if status == "in_progress" else [{"type": "reasoning_text", "text": text}]
    return {"id": item_id, "type": "reasoning", "status": status, "summary": [], "content": content}


def _call_item(call: ToolCall, status: str = "completed") -> dict:
    return {"id": f"fc_{call.id}", "type": "function_call", "status": status,
            "call_id": call.id, "name": call.name, "arguments": call.arguments_json}


def _response(meta: dict, status: str, output: list, usage: Usage | None,
              reason: str | None = None) -> dict:
    incomplete = {"reason": "max_output_tokens"} if reason == "length" else None
    return {**meta, "object": "response", "status": status, "output": output,
            "incomplete_details": incomplete, "error": None,
            "usage": _usage(usage) if usage else None}


def _status(done: Done) -> str:
    return {"length": "incomplete", "error": "failed", "cancelled": "cancelled"}.get(done.reason, "completed")


def _item_status(done: Done) -> str:
    """A message item cut off by the token limit is "incomplete", as OpenAI marks it."""
    return "incomplete" if done.reason == "length" else "completed"


async def responses(request: web.Request) -> web.StreamResponse:
    backend = backend_of(request)
    body = await read_json(request)
    text_opts = get(body, "text", dict, {})
    chat = openai_chat(request, body, "responses", input_messages(body), text_opts.get("format"))
    meta = {"id": f"resp_{uuid.uuid4().hex[:24]}", "created_at": int(time.time()), "model": model_name(body, backend),
            "instructions": body.get("instructions"), "tools": body.get("tools") or [],
            "tool_choice": body.get("tool_choice") or "auto",
            "parallel_tool_calls": bool(body.get("parallel_tool_calls", True))}
    if get(body, "stream", bool, False):
        return await _stream(request, chat, meta, backend)
    result: Completion = await backend.complete(chat)
    result.raise_for_failure()
    output = [_reasoning_item(f"rs_{uuid.uuid4().hex[:24]}", result.thinking)] if result.thinking else []
    output += ([_message_item(f"msg_{uuid.uuid4().hex[:24]}", result.text, _item_status(result.done))]
               if result.text else [])
    output += [_call_item(c) for c in result.calls]
    return web.json_response({**_response(meta, _status(result.done), output, result.done.usage,
                                          result.done.reason), **guard_detail(result.done)})


class _ResponseEvents:
    """Writes one response's event sequence, numbering events as the API does."""

    def __init__(self, stream: EventStream, meta: dict):
        self.stream, self.meta, self.seq = stream, meta, 0
        self.output: list[dict] = []
        self.msg_id: str | None = None
        self.text = ""
        self.reasoning_id: str | None = None
        self.reasoning = ""

    async def send(self, kind: str, **fields) -> None:
        await self.stream.send({"type": kind, "sequence_number": self.seq, **fields}, event=kind)
        self.seq += 1

    async def reasoning_delta(self, text: str) -> None:
        if self.reasoning_id is None:
            self.reasoning_id = f"rs_{uuid.uuid4().hex[:24]}"
            await self.send("response.output_item.added", output_index=len(self.output),
                            item=_reasoning_item(self.reasoning_id, "", "in_progress"))
        self.reasoning += text
        await self.send("response.reasoning_text.delta", item_id=self.reasoning_id,
                        output_index=len(self.output), content_index=0, delta=text)

    async def close_reasoning(self) -> None:
        if self.reasoning_id is None:
            return
        index, item = len(self.output), _reasoning_item(self.reasoning_id, self.reasoning)
        await self.send("response.reasoning_text.done", item_id=self.reasoning_id, output_index=index,
                        content_index=0, text=self.reasoning)
        await self.send("response.output_item.done", output_index=index, item=item)
        self.output.append(item)
        self.reasoning_id, self.reasoning = None, ""

    async def text_delta(self, text: str) -> None:
        await self.close_reasoning()
        if self.msg_id is None:
            self.msg_id = f"msg_{uuid.uuid4().hex[:24]}"
            await self.send("response.output_item.added", output_index=len(self.output),
                            item=_message_item(self.msg_id, "", "in_progress"))
            await self.send("response.content_part.added", item_id=self.msg_id,
                            output_index=len(self.output), content_index=0,
                            part={"type": "output_text", "text": "", "annotations": []})
        self.text += text
        await self.send("response.output_text.delta", item_id=self.msg_id,
                        output_index=len(self.output), content_index=0, delta=text, logprobs=[])

    async def close_text(self, status: str = "completed") -> None:
        await self.close_reasoning()
        if self.msg_id is None:
            return
        index, part = len(self.output), {"type": "output_text", "text": self.text, "annotations": []}
        await self.send("response.output_text.done", item_id=self.msg_id, output_index=index,
                        content_index=0, text=self.text, logprobs=[])
        await self.send("response.content_part.done", item_id=self.msg_id, output_index=index,
                        content_index=0, part=part)
        item = _message_item(self.msg_id, self.text, status)
        await self.send("response.output_item.done", output_index=index, item=item)
        self.output.append(item)
        self.msg_id, self.text = None, ""

    async def call(self, call: ToolCall) -> None:
        await self.close_text()
        index, item = len(self.output), _call_item(call)
        await self.send("response.output_item.added", output_index=index,
                        item={**item, "status": "in_progress", "arguments": ""})
        await self.send("response.function_call_arguments.delta", item_id=item["id"],
                        output_index=index, delta=item["arguments"])
        await self.send("response.function_call_arguments.done", item_id=item["id"],
                        output_index=index, arguments=item["arguments"])
        await self.send("response.output_item.done", output_index=index, item=item)
        self.output.append(item)


async def _stream(request: web.Request, chat: Chat, meta: dict, backend) -> web.StreamResponse:
    async with aclosing(await start(backend, chat)) as outputs:
        events = _ResponseEvents(await EventStream(request).open(), meta)
        await events.send("response.created", response=_response(meta, "in_progress", [], None))
        # Sent again while the reply is silent: a comment does not reset clients' idle timers (Codex's).
        outputs.keep_alive = lambda: events.send("response.in_progress",
                                                 response=_response(meta, "in_progress", [], None))
        await outputs.keep_alive()
        async for out in outputs:
            await _send_output(events, meta, out)
    return await events.stream.close()


async def _send_output(events: _ResponseEvents, meta: dict, out) -> None:
    if isinstance(out, Text) and out.text:
        await events.text_delta(out.text)
    elif isinstance(out, Thinking):
        await events.reasoning_delta(out.text)
    elif isinstance(out, ToolCall):
        await events.call(out)
    elif isinstance(out, Done):
        await events.close_text(_item_status(out))
        final = {**_response(meta, _status(out), events.output, out.usage, out.reason), **guard_detail(out)}
        if failure := out.failure():
            final["status"], (kind, message) = "failed", failure
            final["error"] = {"code": kind, "message": message}
            await events.send("response.failed", response=final)
        elif out.reason == "length":
            await events.send("response.incomplete", response=final)
        else:
            await events.send("response.completed", response=final)


def register(app: web.Application) -> None:
    app.router.add_post("/v1/responses", responses)
    app.router.add_post("/responses", responses)
