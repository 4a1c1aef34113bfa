"""Writers for streamed replies: Server-Sent Events (OpenAI, Anthropic) and NDJSON (Ollama).

If the client hangs up, a write raises ConnectionResetError; the handler's task is also
cancelled by aiohttp (handler_cancellation), which closes the Backend stream and so
cancels the request in the engine.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from locals.server.state import STREAM_OPEN


# Characters JSON leaves raw that str.splitlines() breaks a line at (NEL, the Unicode line and
# paragraph separators): escaped, so a client that splits a stream that way still reads whole
# events. A fuzzed reply's token held one and a test client's split cut its event in two.
_LINE_BREAKERS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def event_json(data: Any) -> str:
    """`data` as one line of JSON: non-ASCII kept as is, but for the characters that split lines."""
    return json.dumps(data, ensure_ascii=False).translate(_LINE_BREAKERS)


class EventStream:
    """One streamed response; `send` writes one event (SSE) or one line (NDJSON)."""

    def __init__(self, request: web.Request, *, ndjson: bool = False):
        self.request = request
        self.ndjson = ndjson
        self.response = web.StreamResponse(headers={
            "Content-Type": "application/x-ndjson" if ndjson else "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        })

    async def open(self) -> "EventStream":
        self.request[STREAM_OPEN] = self.response
        await self.response.prepare(self.request)
        return self

    async def send(self, data: Any, event: str | None = None) -> None:
        payload = data if isinstance(data, str) else event_json(data)
        if self.ndjson:
            chunk = payload + "\n"
        else:
            chunk = (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"
        await self.response.write(chunk.encode())

    async def comment(self) -> None:
        """An SSE comment line: keeps a silent stream's connection busy; clients skip it."""
        await self.response.write(b": keep-alive\n\n")

    async def close(self) -> web.StreamResponse:
        await self.response.write_eof()
        return self.response
