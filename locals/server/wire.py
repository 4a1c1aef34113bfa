"""Request reading and validation shared by the API modules, and the error shape of each API.

Handlers raise `locals.errors.RequestError` (or a subclass) for bad input; the error
middleware in `app.py` turns it into the JSON body of the API the path belongs to.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from locals.errors import RequestError

_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean",
               list: "an array", dict: "an object"}


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object, or a RequestError saying what is wrong with it."""
    raw = await request.read()  # raises HTTPRequestEntityTooLarge past client_max_size
    if not raw.strip():
        raise RequestError("the request body is empty; send a JSON object")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    return body


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


_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                 403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                 503: "service_unavailable"}
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                    403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                    503: "overloaded_error"}


def error_body(api: str, status: int, message: str) -> dict[str, Any]:
    """The JSON error body each API's clients expect."""
    if api == "ollama":
        return {"error": message}
    if api == "anthropic":
        kind = _ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}
    kind = _OPENAI_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def error_response(api: str, status: int, message: str) -> web.Response:
    return web.json_response(error_body(api, status, message), status=status)
