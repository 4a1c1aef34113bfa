"""A stand-in OpenAI chat server run as a subprocess by the traffic benchmark's tests: streams
`max_tokens` one-word chunks `gap` seconds apart after `ttft` seconds, then usage when asked.

    python tests/helpers/traffic_fake_server.py PORT [--ttft S] [--gap S] [--no-usage] [--fail-after N] [--broken]

`--fail-after N` answers 500 from the N+1-th chat request on; `--broken` answers /health as
locals does when its engine failed; every body is appended to `--bodies FILE` (one JSON a line)
when given.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from aiohttp import web


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--ttft", type=float, default=0.01)
    parser.add_argument("--gap", type=float, default=0.001)
    parser.add_argument("--no-usage", action="store_true")
    parser.add_argument("--fail-after", type=int, default=None)
    parser.add_argument("--bodies", default=None)
    parser.add_argument("--broken", action="store_true")
    args = parser.parse_args()
    seen = [0]

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen[0] += 1
        if args.bodies:
            with open(args.bodies, "a") as f:
                f.write(json.dumps(body) + "\n")
        if args.fail_after is not None and seen[0] > args.fail_after:
            return web.json_response({"error": {"message": "scripted failure"}}, status=500)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)

        async def send(data: dict | str) -> None:
            await resp.write(f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode())

        await send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        await resp.write(b": keep-alive\n\n")
        await asyncio.sleep(args.ttft)
        n = body["max_tokens"]
        for i in range(n):
            await send({"choices": [{"index": 0, "delta": {"content": f" w{i}"}, "finish_reason": None}]})
            await asyncio.sleep(args.gap)
        await send({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        if not args.no_usage and (body.get("stream_options") or {}).get("include_usage"):
            prompt = sum(len(str(m.get("content", "")).split()) for m in body["messages"])
            await send({"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": n,
                                                 "prompt_tokens_details": {"cached_tokens": 0}}})
        await send("[DONE]")
        return resp

    async def health(request: web.Request) -> web.Response:
        if args.broken:
            return web.json_response({"status": "failed", "error": "engine thread failed"}, status=503)
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
