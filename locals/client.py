"""A small async client for any OpenAI-compatible chat endpoint, plus `ensure_server`.

It speaks only HTTP (aiohttp), so the runner works against locals, mlx_lm.server, vLLM or
SGLang alike. Tool calls a server left in the text (hermes `<tool_call>` blocks) are
recovered here so callers always see structured calls.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from locals import __version__
from locals.errors import DaemonNotRunning, LocalsError

_TOOL_BLOCK = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


class ClientError(LocalsError):
    """The server answered with an error status or a body that is not a chat completion."""


@dataclass
class ToolCall:
    """One function call of an assistant message; `arguments` is already decoded."""

    id: str
    name: str
    arguments: dict[str, Any]
    raw_arguments: str = ""


@dataclass
class ChatReply:
    """The first choice of a chat completion, with usage."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cut_call: str = ""  # a call max_tokens cut off, which locals did not return (`locals.cut_tool_call`)

    def assistant_message(self) -> dict[str, Any]:
        """The message to append to the conversation so the next turn sees this reply."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content or ""}
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.raw_arguments or json.dumps(call.arguments)},
                }
                for call in self.tool_calls
            ]
        return message


def v1_url(base_url: str) -> str:
    """`http://host:port`, `.../v1` or `.../v1/` all become `http://host:port/v1`."""
    url = base_url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def ensure_server(model: str | None = None, port: int | None = None, remember_port: bool = True) -> str:
    """Start the locals daemon if it is not running and return its base URL (`daemon.ensure_running`)."""
    from locals.daemon import ensure_running  # process management, for the CLI only: import on demand

    return ensure_running(model, port, remember_port)


class ChatClient:
    """Chat completions against one OpenAI-compatible server; use as an async context manager."""

    def __init__(self, base_url: str, model: str | None = None, api_key: str = "local", timeout_s: float = 600.0):
        self.base_url = v1_url(base_url)
        self.model = model
        self._headers = {"Authorization": f"Bearer {api_key}", "User-Agent": f"locals-run/{__version__}"}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> "ChatClient":
        self._session = aiohttp.ClientSession(headers=self._headers, timeout=self._timeout)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def resolve_model(self) -> str:
        """The model to name in requests: the one given, else the first the server lists."""
        if self.model:
            return self.model
        data = await self._request("GET", "/models")
        models = data.get("data") or []
        if not models:
            raise ClientError(f"{self.base_url}/models lists no model; pass --model")
        self.model = models[0]["id"]
        return self.model

    async def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        parallel_tool_calls: bool | None = None,
        response_format: dict[str, Any] | None = None,
        temperature: float = 0.0,
        seed: int | None = None,
        max_tokens: int = 1024,
        session: str | None = None,
    ) -> ChatReply:
        """One non-streaming chat completion; `session` names the conversation to the server
        (`X-Session-Id`: the locals dashboard groups requests by it, other servers ignore it)."""
        body: dict[str, Any] = {
            "model": await self.resolve_model(),
            "messages": messages,
            "temperature": temperature,
            "max_tokens": max_tokens,
            "stream": False,
        }
        if seed is not None:
            body["seed"] = seed
        if tools:
            body["tools"] = tools
            if tool_choice is not None:
                body["tool_choice"] = tool_choice
            if parallel_tool_calls is not None:
                body["parallel_tool_calls"] = parallel_tool_calls
        if response_format is not None:
            body["response_format"] = response_format
        headers = {"X-Session-Id": session} if session else None
        return parse_reply(await self._request("POST", "/chat/completions", body, headers))

    async def _request(self, method: str, path: str, body: dict[str, Any] | None = None,
                       headers: dict[str, str] | None = None) -> dict[str, Any]:
        if self._session is None:
            raise RuntimeError("ChatClient used outside `async with`")
        url = self.base_url + path
        try:
            async with self._session.request(method, url, json=body, headers=headers) as resp:
                text = await resp.text()
                if resp.status >= 400:
                    raise ClientError(f"{url} answered {resp.status}: {_error_message(text)}")
        except asyncio.TimeoutError as exc:
            raise ClientError(f"{url} did not answer within {self._timeout.total:g} s") from exc
        except aiohttp.ClientConnectionError as exc:
            raise DaemonNotRunning(
                f"cannot reach {self.base_url} ({exc}): is a server running there? (`locals start` starts locals' own)"
            ) from exc
        try:
            return json.loads(text)
        except ValueError as exc:
            raise ClientError(f"{url} answered with a body that is not JSON: {' '.join(text.split())[:200]!r}; "
                              "is --server the base URL of an OpenAI-compatible API (…/v1)?") from exc


def _error_message(text: str) -> str:
    """An error body's message on one line: an OpenAI-shaped error's own, else the body's start
    (an HTML page says it is one: not an OpenAI-compatible server)."""
    try:
        err = json.loads(text).get("error")
        message = err.get("message", str(err)) if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        if text.lstrip()[:15].lower().startswith(("<!doctype html", "<html")):
            return "an HTML page, not an OpenAI-compatible error; is --server the API's base URL (…/v1)?"
        message = text
    return " ".join(message.split())[:300]


def parse_reply(data: dict[str, Any]) -> ChatReply:
    """The first choice of a chat completion body as a ChatReply."""
    try:
        choice = data["choices"][0]
        message = choice.get("message") or {}
    except (KeyError, IndexError, TypeError) as exc:
        raise ClientError(f"not a chat completion: {json.dumps(data)[:300]}") from exc
    usage = data.get("usage") or {}
    content = message.get("content") or ""
    calls = [_parse_call(i, c) for i, c in enumerate(message.get("tool_calls") or [])]
    if not calls:
        content, calls = recover_text_tool_calls(content)
    return ChatReply(
        content=content,
        tool_calls=calls,
        finish_reason=choice.get("finish_reason") or "",
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        cut_call=str((data.get("locals") or {}).get("cut_tool_call") or ""),
    )


def _parse_call(index: int, call: dict[str, Any]) -> ToolCall:
    function = call.get("function") or {}
    raw = function.get("arguments") or "{}"
    return ToolCall(
        id=call.get("id") or f"call_{index}",
        name=function.get("name") or "",
        arguments=_decode_arguments(raw),
        raw_arguments=raw if isinstance(raw, str) else json.dumps(raw),
    )


def _decode_arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def recover_text_tool_calls(content: str) -> tuple[str, list[ToolCall]]:
    """Hermes-style `<tool_call>{"name":..,"arguments":..}</tool_call>` blocks left in the text
    by servers that do not parse them (e.g. mlx_lm.server on a model without a tool parser)."""
    calls = []
    for match in _TOOL_BLOCK.finditer(content):
        try:
            obj = json.loads(match.group(1))
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            args = obj.get("arguments") or obj.get("parameters") or {}
            args = _decode_arguments(args)
            calls.append(ToolCall(id=f"call_{len(calls)}", name=obj["name"], arguments=args, raw_arguments=json.dumps(args)))
    if calls:
        content = _TOOL_BLOCK.sub("", content).strip()
    return content, calls
