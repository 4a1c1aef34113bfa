"""Keeps the server local: refuses foreign Host headers (DNS rebinding), foreign web-page
Origins (a site you visit calling localhost), and, with --api-key, requests without the key.
"""

from __future__ import annotations

import hmac
import ipaddress
import socket
from urllib.parse import urlsplit

from aiohttp import web

from locals.server.wire import api_of, error_response
from locals.server.state import STATE

LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}
# Read-only monitoring needs no key (probes, the dashboard, `locals status`); generation does,
# and so does every other method on these paths (a team's progress report).
OPEN_PATHS = {"/health", "/", "/dashboard", "/v1/locals/status", "/metrics", "/v1/locals/history",
              "/v1/locals/conversations", "/v1/locals/team", "/static/dashboard.js", "/static/charts.js",
              "/static/dashboard.css"}
CONTENT_PATHS = {"/v1/locals/history", "/v1/locals/conversations", "/v1/locals/team"}


def is_loopback(host: str) -> bool:
    """True for loopback names and addresses (a host as written in Host/Origin, no port)."""
    host = host.strip().lower().rstrip(".")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host in LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_allowed(host: str) -> bool:
    """Host headers a local-only server answers: loopback, this machine's own name, and names
    no public DNS can point here (a rebinding page needs one of its own): `.local` (mDNS) and
    `.internal` (Docker's `host.docker.internal`, how a container such as Open WebUI reaches the
    host), as Ollama allows."""
    name = host.strip().lower().rstrip(".")
    return (is_loopback(host) or name.endswith((".local", ".internal"))
            or (bool(name) and name == socket.gethostname().lower()))


def host_of(header: str) -> str:
    """The host part of a Host header value (drops the port, keeps IPv6 brackets off)."""
    parsed = urlsplit(f"//{header}")
    return parsed.hostname or ""


def origin_allowed(origin: str) -> bool:
    """Web pages (http/https) must be served from this machine; apps with their own scheme
    (editor webviews, `null` from file pages aside) are not web sites and may call."""
    if origin == "null":
        return False
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https"):
        return bool(parts.scheme)
    return is_loopback(parts.hostname or "")


def _key_of(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key") or request.headers.get("api-key")


@web.middleware
async def local_only(request: web.Request, handler):
    state = request.app[STATE]
    api = api_of(request.path)
    if not state.allow_remote and not host_allowed(host_of(request.headers.get("Host", ""))):
        return error_response(api, 403, "this server answers only requests addressed to "
                              "localhost / 127.0.0.1 (refused Host header)")
    origin = request.headers.get("Origin")
    if origin is not None and not origin_allowed(origin):
        return error_response(api, 403, f"requests from the web page {origin} are refused; "
                              "only pages on this machine may call the local server")
    # What users wrote (conversation titles, team tasks and patches) is open to this machine only.
    monitoring = (request.path in OPEN_PATHS and request.method in ("GET", "HEAD")
                  and (request.path not in CONTENT_PATHS or is_loopback(request.remote or "")))
    if state.api_key and not monitoring and request.method != "OPTIONS":
        key = _key_of(request) or ""
        if not hmac.compare_digest(key.encode(), state.api_key.encode()):
            return error_response(api, 401, "missing or wrong API key; send it as "
                                  "`Authorization: Bearer <key>` or `x-api-key`")
    if request.method == "OPTIONS" and origin:
        return web.Response(status=204)  # CORS preflight; headers added by cors_headers
    return await handler(request)


async def cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare hook (streamed replies too): let allowed local origins read replies."""
    origin = request.headers.get("Origin")
    if origin and origin_allowed(origin):
        response.headers["Access-Control-Allow-Origin"] = origin
        # Named back, not "*": a wildcard never covers `Authorization` (the Fetch standard).
        response.headers["Access-Control-Allow-Headers"] = request.headers.get("Access-Control-Request-Headers", "*")
        response.headers["Access-Control-Allow-Methods"] = "GET, POST, OPTIONS"
        response.headers["Vary"] = "Origin"
