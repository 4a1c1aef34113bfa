"""Request reading and validation shared by the API modules, and the error shape of each API.

Handlers raise `locals.errors.RequestError` (or a subclass) for bad input; the error
middleware in `app.py` turns it into the JSON body of the API the path belongs to.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from aiohttp import web

from locals.errors import RequestError

_LARGEST_FLOAT = int(sys.float_info.max)
_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean",
               list: "an array", dict: "an object"}


# Deeper than any real request (a tool schema nested 30 objects deep is about 65 levels), and
# shallow enough that the recursive code behind (chat templates, schema compilers, json.dumps)
# stays well inside Python's recursion limit; docs/arch/server.md.
MAX_NESTING = 100
# Bodies past this are parsed and checked on a thread: walking millions of values on the event
# loop would hold every stream and /health meanwhile.
THREAD_PARSE_BYTES = 1 << 20
_NESTING_MESSAGE = (f"the request body nests arrays and objects more than {MAX_NESTING} levels "
                    "deep; flatten it")


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object, or a RequestError saying what is wrong with it."""
    declared, limit = request.content_length, request.client_max_size
    if declared is not None and limit and declared > limit:  # refused now, not once that much came
        raise web.HTTPRequestEntityTooLarge(limit, declared)
    raw = await request.read()  # raises HTTPRequestEntityTooLarge past client_max_size
    if not raw.strip():
        raise RequestError("the request body is empty; send a JSON object")
    if len(raw) > THREAD_PARSE_BYTES:
        return await asyncio.to_thread(_parse, raw)
    return _parse(raw)


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw, parse_constant=_refuse_constant)
    except RecursionError:
        raise RequestError(_NESTING_MESSAGE) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    _check_values(body)
    return body


def _refuse_constant(name: str) -> None:
    raise RequestError(f"the request body holds {name}, which is not JSON; send a number or null")


def _check_values(body: dict) -> None:
    """Refuse what parses but breaks the code behind: nesting past MAX_NESTING, and strings
    with a lone UTF-16 surrogate (`"\\ud800"`), which no tokenizer can encode."""
    pending: list[tuple[Any, int]] = [(body, 1)]
    while pending:  # a loop, not recursion: the depth is what is being checked
        value, depth = pending.pop()
        if isinstance(value, (dict, list)):
            if depth > MAX_NESTING:
                raise RequestError(_NESTING_MESSAGE)
            children = [*value, *value.values()] if isinstance(value, dict) else value
            pending.extend((child, depth + 1) for child in children)
        elif isinstance(value, str) and not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise RequestError(
                    f"a string in the request body holds a lone surrogate "
                    f"(\\u{ord(value[exc.start]):04x}); send whole UTF-16 pairs or plain UTF-8") from None


def get(body: dict, key: str, kind: type | tuple[type, ...], default: Any = None,
        *, required: bool = False) -> Any:
    """`body[key]` checked against `kind` (None counts as absent); ints pass where floats do."""
    value = body.get(key)
    if value is None:
        if required:
            raise RequestError(f"`{key}` is required")
        return default
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > _LARGEST_FLOAT:  # float() would raise OverflowError
            raise RequestError(f"`{key}` is too large a number: {str(value)[:20]}…")
        return float(value)
    if isinstance(value, bool) and bool not in kinds:
        ok = False
    else:
        ok = isinstance(value, kinds)
    if not ok:
        names = " or ".join(_TYPE_NAMES.get(k, k.__name__) for k in kinds)
        raise RequestError(f"`{key}` must be {names}, got {json.dumps(value)[:60]}")
    return value


def stop_list(value: Any, key: str = "stop") -> list[str]:
    """A stop field that may be one string or a list of strings."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return list(value)
    raise RequestError(f"`{key}` must be a string or an array of strings")


def api_of(path: str) -> str:
    """Which API's error shape a path answers with: "anthropic", "ollama" or "openai"."""
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path.startswith("/api/"):
        return "ollama"
    return "openai"


# OpenAI's own: an unknown path is an `invalid_request_error` ("Invalid URL"), not a type of its own.
_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                 403: "permission_error", 404: "invalid_request_error", 413: "request_too_large",
                 503: "service_unavailable"}
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                    403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                    503: "overloaded_error"}


def error_body(api: str, status: int, message: str, code: str | None = None) -> dict[str, Any]:
    """The JSON error body each API's clients expect (`code`: OpenAI's `error.code`)."""
    if api == "ollama":
        return {"error": message}
    if api == "anthropic":
        kind = _ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}
    kind = _OPENAI_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def error_response(api: str, status: int, message: str, code: str | None = None) -> web.Response:
    return web.json_response(error_body(api, status, message, code), status=status)
