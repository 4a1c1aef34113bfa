"""Drives one server with planned agent traffic over its OpenAI chat API, streaming, and records
what each agent saw: time to first token, every gap between tokens, wall time, token counts.

A client of any OpenAI-compatible server (locals, mlx_lm.server, llama.cpp's): requests name no
model (mlx_lm.server would try to load one by that name), ask for `usage` in the stream
(`stream_options.include_usage`; where a server sends none, streamed chunks are counted), and
carry the server's own reply back into the conversation, as an agent does, so a server's cache
of the previous turn stays valid. A request that fails ends its agent's conversation; the
failure is recorded, not raised.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import aiohttp

from locals.traffic.workload import TOOLS, AgentPlan, Turn

TEMPERATURE = 0.7  # agents sample; greedy decoding of a small real model loops


@dataclass
class Reply:
    """One request as its client saw it. Times are seconds since `zero` (the server's start)."""

    agent: int
    turn: int  # -1: the burst
    sent: float
    first: float | None = None  # first visible token (content or tool-call delta)
    ended: float = 0.0
    gaps: list[float] = field(default_factory=list)  # between chunks that carry tokens
    chunks: int = 0
    completion_tokens: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    counted: str = "usage"  # or "chunks", where the server sent no usage
    finish: str | None = None
    error: str | None = None
    text: str = ""
    calls: dict[int, dict] = field(default_factory=dict)

    @property
    def wall(self) -> float:
        return self.ended - self.sent

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.sent


def _read_chunk(reply: Reply, chunk: dict, now: float, last: list[float]) -> None:
    """Fold one streamed chunk into `reply`; `last` holds the previous token chunk's time."""
    if "error" in chunk:
        reply.error = str(chunk["error"].get("message") if isinstance(chunk["error"], dict) else chunk["error"])
    usage = chunk.get("usage")
    if usage:
        reply.completion_tokens = usage.get("completion_tokens", 0)
        reply.prompt_tokens = usage.get("prompt_tokens")
        reply.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        content, calls = delta.get("content"), delta.get("tool_calls")
        if content or calls:
            if reply.first is None:
                reply.first = now
            else:
                reply.gaps.append(now - last[0])
            last[0] = now
            reply.chunks += 1
            reply.text += content or ""
            for call in calls or []:
                slot = reply.calls.setdefault(call.get("index", 0), {"id": "", "name": "", "arguments": ""})
                fn = call.get("function") or {}
                slot["id"] = call.get("id") or slot["id"]
                slot["name"] += fn.get("name") or ""
                slot["arguments"] += fn.get("arguments") or ""
        if choice.get("finish_reason"):
            reply.finish = choice["finish_reason"]


async def stream_chat(session: aiohttp.ClientSession, url: str, body: dict, reply: Reply, zero: float) -> Reply:
    """POST a streaming chat request and fill `reply` as its chunks arrive."""
    last = [0.0]
    try:
        async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                reply.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                return reply
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue  # blank lines and keep-alive comments
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                _read_chunk(reply, json.loads(data), time.perf_counter() - zero, last)
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as exc:
        reply.error = f"{type(exc).__name__}: {exc}"
    finally:
        reply.ended = time.perf_counter() - zero
    if not reply.completion_tokens:
        reply.completion_tokens, reply.counted = reply.chunks, "chunks"
    if reply.error is None and reply.first is None:
        reply.error = "the reply had no tokens"
    return reply


def next_messages(previous: Reply | None, text: str) -> list[dict]:
    """What the agent adds before its next request: the server's reply, then the tool results
    its tool calls asked for (the turn's text in the first), or the text as a user message."""
    if previous is None:
        return [{"role": "user", "content": text}]
    calls = [previous.calls[i] for i in sorted(previous.calls)]
    assistant: dict = {"role": "assistant", "content": previous.text}
    if not calls:
        return [assistant, {"role": "user", "content": text}]
    ids = [c["id"] or f"call_{previous.agent}_{previous.turn}_{i}" for i, c in enumerate(calls)]
    assistant["tool_calls"] = [{"id": cid, "type": "function",
                                "function": {"name": c["name"], "arguments": c["arguments"] or "{}"}}
                               for cid, c in zip(ids, calls)]
    return [assistant] + [{"role": "tool", "tool_call_id": cid, "content": text if i == 0 else "done"}
                          for i, cid in enumerate(ids)]


def _body(messages: list[dict], turn: Turn, tools: bool) -> dict:
    body = {"messages": messages, "max_tokens": turn.max_tokens, "temperature": TEMPERATURE,
            "stream": True, "stream_options": {"include_usage": True}}
    if tools:
        body["tools"] = TOOLS
    return body


async def _conversation(session, url: str, plan: AgentPlan, zero: float, t0: float,
                        replies: list[Reply]) -> tuple[list[dict], Reply | None] | None:
    """An agent's turns with tool time between them; None if one of its requests failed."""
    await asyncio.sleep(max(0.0, t0 + plan.start_s - (time.perf_counter() - zero)))
    messages: list[dict] = [{"role": "system", "content": plan.system}]
    reply = None
    for t, turn in enumerate(plan.turns):
        messages += next_messages(reply, turn.text)
        reply = Reply(plan.index, t, sent=time.perf_counter() - zero)
        replies.append(await stream_chat(session, url, _body(messages, turn, plan.offers_tools), reply, zero))
        if reply.error:
            return None
        await asyncio.sleep(turn.tool_time_s)
    return messages, reply


async def drive(url: str, plans: list[AgentPlan], zero: float, timeout_s: float) -> dict[str, list[Reply]]:
    """The agents' conversations, then the burst: every agent still talking sends its last turn
    at once. Returns the replies of both phases."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        talks: list[Reply] = []
        t0 = time.perf_counter() - zero
        ends = await asyncio.gather(*(_conversation(session, url, p, zero, t0, talks) for p in plans))
        burst = []
        for plan, end in zip(plans, ends):
            if end is not None:
                messages, last = end
                messages = messages + next_messages(last, plan.burst.text)
                burst.append((_body(messages, plan.burst, plan.offers_tools), Reply(plan.index, -1, sent=0.0)))
        sent = time.perf_counter() - zero
        for _, reply in burst:
            reply.sent = sent
        burst_replies = await asyncio.gather(*(stream_chat(session, url, body, r, zero) for body, r in burst))
    return {"agents": sorted(talks, key=lambda r: r.sent), "burst": list(burst_replies)}
