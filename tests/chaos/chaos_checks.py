"""What every answer to a hostile request must be, and the HTTP senders the chaos tests share.

An answer passes when it is a 4xx JSON error in the error shape of the endpoint's API, or a
valid reply (one JSON object, or a stream whose every event parses and none reports an
error). A 5xx, a dropped connection or a reply that does not parse is a problem, returned
as one line that names the endpoint and the body that caused it.
"""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import dataclass

import aiohttp

from tests.chaos.chaos_bodies import Endpoint


ANSWER_TIMEOUT_S = 300  # a CPU reading a long prompt beside other requests


@dataclass
class Answer:
    status: int  # 0: no answer (the connection dropped or timed out)
    content_type: str
    body: bytes
    failure: str = ""


def error_shape_ok(api: str, payload) -> bool:
    """Whether `payload` is the JSON error body clients of `api` parse."""
    if not isinstance(payload, dict):
        return False
    if api == "ollama":
        return isinstance(payload.get("error"), str) and bool(payload["error"])
    error = payload.get("error")
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return False
    if api == "anthropic":
        return payload.get("type") == "error" and isinstance(error.get("type"), str)
    return isinstance(error.get("type"), str)


def _stream_events(answer: Answer) -> list:
    """The JSON payloads of a streamed reply (SSE or NDJSON); ValueError where one does not parse."""
    text = answer.body.decode("utf-8")
    if "ndjson" in answer.content_type:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    events = []
    for line in text.splitlines():
        if line.startswith("data: ") and line[6:] != "[DONE]":
            events.append(json.loads(line[6:]))
    return events


def problem_of(endpoint: Endpoint, answer: Answer, body: bytes) -> str | None:
    """None when the answer is acceptable, else one line saying what went wrong."""
    shown = body[:160] + (b"..." if len(body) > 160 else b"")
    where = f"{endpoint.path} ({len(body)} bytes: {shown!r})"
    if answer.status == 0:
        return f"{where}: no answer ({answer.failure})"
    if answer.status >= 500:
        return f"{where}: {answer.status} {answer.body[:300]!r}"
    try:
        if "event-stream" in answer.content_type or "ndjson" in answer.content_type:
            errors = [e for e in _stream_events(answer) if isinstance(e, dict)
                      and (e.get("error") or e.get("type") == "error")]
            return f"{where}: the stream reported {errors[0]}" if errors else None
        payload = json.loads(answer.body)
    except ValueError as exc:
        return f"{where}: {answer.status} reply does not parse ({exc}): {answer.body[:200]!r}"
    if answer.status >= 400:
        ok = error_shape_ok(endpoint.api, payload)
        return None if ok else f"{where}: {answer.status} not in {endpoint.api}'s error shape: {payload}"
    return None if isinstance(payload, dict) else f"{where}: reply is not an object: {payload!r:.200}"


async def post(session: aiohttp.ClientSession, url: str, body: bytes) -> Answer:
    """POST raw bytes as JSON and read the whole answer."""
    try:
        async with session.post(url, data=body, headers={"Content-Type": "application/json"},
                                timeout=aiohttp.ClientTimeout(total=ANSWER_TIMEOUT_S)) as resp:
            return Answer(resp.status, resp.headers.get("Content-Type", ""), await resp.read())
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        return Answer(0, "", b"", f"{type(exc).__name__}: {exc}")


def post_lying_length(port: int, path: str, body: bytes, declared: int, wait_s: float) -> Answer:
    """POST with a Content-Length of `declared` whatever the body's size; the first answer in
    `wait_s` (status 0 when the server, rightly, still waits for bytes that never come)."""
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {declared}\r\nConnection: close\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        sock.sendall(head + body)
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except (socket.timeout, ConnectionResetError):
            pass
    if not data:
        return Answer(0, "", b"", "nothing within the wait")
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return Answer(int(lines[0].split()[1]), headers.get("Content-Type", ""), rest)
