"""Builds the aiohttp application: routes of every API, the local-only guard, JSON errors.

`create_app(state)` is all tests need; `run.serve` adds model loading and the engine.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from locals.errors import RequestError, ServerStopping
from locals.server import (anthropic, dashboard, history, metrics, ollama, openai, responses, status,
                           team)
from locals.server.wire import api_of, error_response
from locals.server.security import cors_headers, local_only
from locals.server.state import STATE, STREAM_OPEN, NotReady, ServerState

log = logging.getLogger("locals.server")
RETRY_AFTER_S = 5  # a 503's `Retry-After`: the model still loading, or the server restarting


@web.middleware
async def json_errors(request: web.Request, handler):
    """Every failure answers in the error shape of the API the path belongs to."""
    api = api_of(request.path)
    try:
        return await handler(request)
    except RequestError as exc:
        return error_response(api, exc.status, exc.message_for(api), exc.code)
    except (NotReady, ServerStopping) as exc:
        response = error_response(api, 503, str(exc))
        response.headers["Retry-After"] = str(RETRY_AFTER_S)  # clients that honour it wait, then send again
        return response
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        response = error_response(api, exc.status, _http_message(request, exc))
        if "Allow" in exc.headers:  # a 405 says which methods the path takes
            response.headers["Allow"] = exc.headers["Allow"]
        return response
    except asyncio.CancelledError:
        raise
    except ConnectionResetError:
        if request.get(STREAM_OPEN) is not None:  # the client hung up mid-stream: nothing to report
            return request[STREAM_OPEN]
        raise
    except Exception as exc:
        if request.get(STREAM_OPEN) is not None:
            raise  # headers are out; nothing but closing the stream is left
        log.exception("error answering %s %s", request.method, request.path)
        return error_response(api, 500, f"internal error: {exc}")


def _http_message(request: web.Request, exc: web.HTTPException) -> str:
    if exc.status == 404:
        return f"no such endpoint: {request.method} {request.path}"
    if exc.status == 405:
        return f"{request.path} does not accept {request.method}"
    if exc.status == 413:
        limit_mb = request.app[STATE].max_body_mb
        return (f"the request body is over the server's {limit_mb} MB limit; "
                "restart it with a larger --max-body-mb")
    return exc.reason or exc.text or "request failed"


def create_app(state: ServerState) -> web.Application:
    app = web.Application(middlewares=[json_errors, local_only],
                          client_max_size=state.max_body_mb * (1 << 20))
    app[STATE] = state
    for module in (openai, responses, anthropic, ollama, status, metrics, history, team, dashboard):
        module.register(app)
    app.on_response_prepare.append(cors_headers)
    return app
