"""One agent: a tool-calling conversation with the server inside one worktree, up to S steps.

It stops when it finishes (question mode), when its worktree passes the check, when its
steps run out, or when the runner cancels it because another agent already won.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import aiohttp

from agents.check import CheckVerdict
from agents.events import AgentStep, CheckDone, EventSink
from agents.prompts import final_answer_messages
from agents.tools import Toolbox, tool_schemas
from locals.client import ChatClient, ToolCall
from locals.errors import LocalsError

log = logging.getLogger(__name__)

NUDGE = "Reply with a tool call. When the work is done, call finish."


def _nudge(reply, max_tokens: int) -> str:
    """What the agent is told after a reply with no call: a call cut off by the token limit
    (not run, the server drops it) asks for smaller pieces."""
    if not reply.cut_call:
        return NUDGE
    return (f"Your {reply.cut_call} call was cut off at the {max_tokens}-token reply limit and was not run. "
            "Make it smaller: change a file with edit_file rather than rewrite it, or write a short first "
            "version and extend it with edit_file.")


def without_repeats(text: str) -> str:
    """An answer with its paragraphs said once: a small model that loops on a sentence until
    its token limit (too short for the server's loop guard) gives it once, and the cut-off
    restart of it at the end goes."""
    kept: list[str] = []
    for paragraph in (p.strip() for p in text.strip().split("\n\n")):
        if paragraph and paragraph not in kept:
            kept.append(paragraph)
    if len(kept) > 1 and any(k.startswith(kept[-1]) for k in kept[:-1]):
        kept.pop()
    return "\n\n".join(kept)


CheckFn = Callable[[], Awaitable[CheckVerdict]]


@dataclass
class Sampling:
    """Per-agent sampling, different for each agent so the team explores."""

    temperature: float
    seed: int
    max_tokens: int = 1024


@dataclass
class AgentResult:
    """How an agent ended: "passed", "answered", "failed" (steps ran out), "error"."""

    agent: int
    status: str
    summary: str = ""
    verdict: CheckVerdict | None = None  # the last check's; the passing one when status is "passed"
    steps: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


def sampling_for(index: int, max_tokens: int = 1024) -> Sampling:
    """Agent 0 is near-greedy; later agents sample hotter, each with its own seed."""
    return Sampling(temperature=min(0.2 + 0.25 * index, 1.0), seed=1000 + index, max_tokens=max_tokens)


def describe(call: ToolCall) -> str:
    """A one-line description of a tool call for the display."""
    args = call.arguments
    key = {"run": "command", "search": "pattern", "finish": "summary"}.get(call.name, "path")
    value = str(args.get(key, "")).replace("\n", " ")
    return f"{call.name} {value[:60]}".strip()


def _tool_message(call: ToolCall, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": content}


class Agent:
    """Runs the conversation; `check` is None in question mode."""

    def __init__(self, part: int, index: int, client: ChatClient, toolbox: Toolbox, messages: list[dict[str, Any]],
                 sampling: Sampling, max_steps: int, on_event: EventSink, check: CheckFn | None = None,
                 session: str | None = None):
        self.part, self.index = part, index
        self.session = session  # sent with each request, so the server can tell the agents apart
        self.client, self.toolbox = client, toolbox
        self.messages = messages
        self.sampling = sampling
        self.max_steps = max_steps
        self.on_event = on_event
        self.check = check
        self.result = AgentResult(agent=index, status="working")
        self._changed = False

    async def run(self) -> AgentResult:
        try:
            await self._loop()
        except (LocalsError, aiohttp.ClientError) as exc:
            self.result.status, self.result.summary = "error", str(exc)
            self._emit("error: " + str(exc)[:80], status="error")
        except Exception as exc:  # a defect in one agent's step ends that agent, never its team's run
            log.exception("agent %d stopped on an unexpected error", self.index)
            self.result.status, self.result.summary = "error", f"{type(exc).__name__}: {exc}"
            self._emit(f"error: {type(exc).__name__}: {exc}"[:87], status="error")
        except asyncio.CancelledError:
            self.result.status = "stopped"
            self._emit("stopped", status="stopped")
            raise
        return self.result

    async def _loop(self) -> None:
        schemas = tool_schemas(self.toolbox.names, self.toolbox.sandbox.network)
        for step in range(1, self.max_steps + 1):
            self.result.steps = step
            reply = await self.client.chat(
                self.messages, tools=schemas, tool_choice="required", parallel_tool_calls=False,
                temperature=self.sampling.temperature,
                seed=self.sampling.seed + step, max_tokens=self.sampling.max_tokens, session=self.session,
            )
            self.result.prompt_tokens += reply.prompt_tokens
            self.result.completion_tokens += reply.completion_tokens
            self.messages.append(reply.assistant_message())
            if not reply.tool_calls:
                self.messages.append({"role": "user", "content": _nudge(reply, self.sampling.max_tokens)})
                self._emit(f"({reply.cut_call} cut off at max_tokens)" if reply.cut_call
                           else "(answered in text, no tool call)")
                continue
            for i, call in enumerate(reply.tool_calls):
                if await self._handle(call):
                    return
                if call.name == "finish":
                    # A server that ignores parallel_tool_calls=false may send more; the API still
                    # wants a result for each call.
                    for rest in reply.tool_calls[i + 1:]:
                        self.messages.append(_tool_message(rest, "skipped: calls after finish are not run"))
                    break
        await self._out_of_steps()

    async def _handle(self, call: ToolCall) -> bool:
        """Execute one call and append its result; True when the agent is done."""
        outcome = await self.toolbox.execute(call.name, call.arguments)
        self._changed |= outcome.changed
        self._emit(describe(call) + ("" if outcome.ok else "  (failed)"))
        content = outcome.text
        if outcome.finished:
            if self.check is None:
                if outcome.text.strip():
                    self.result.status, self.result.summary = "answered", outcome.text.strip()
                    self._emit("finish", status="answered")
                    return True
                content = "The answer is empty: call finish with the answer."
            else:
                verdict = await self._run_check()
                if verdict.passed:
                    self.result.summary = outcome.text.strip()
                    return True
                content = f"The check failed:\n{verdict.feedback()}\nFix it, then call finish again."
        self.messages.append(_tool_message(call, content))
        return False

    async def _run_check(self) -> CheckVerdict:
        self._emit("checking", status="checking")
        self._changed = False  # judged from here on; only later changes warrant another check
        verdict = await self.check()
        self.result.verdict = verdict
        self.on_event(CheckDone(self.part, self.index, verdict.passed, verdict.summary()))
        if verdict.passed:
            self.result.status = "passed"
            self._emit("check passed", status="passed")
        return verdict

    async def _out_of_steps(self) -> None:
        if self.check is not None:
            # The agent may have fixed things without calling finish: its work still gets judged once.
            if self._changed and (await self._run_check()).passed:
                return
            self.result.status = "failed"
            self._emit("out of steps", status="failed")
            return
        await self._final_answer()

    async def _final_answer(self) -> None:
        """Question mode with steps spent: ask once more, without tools, for the answer."""
        asked = final_answer_messages(self.messages)
        reply = await self.client.chat(asked, temperature=self.sampling.temperature,
                                       seed=self.sampling.seed, max_tokens=self.sampling.max_tokens,
                                       session=self.session)
        self.messages += [asked[-1], reply.assistant_message()]  # a kept transcript shows what was asked
        self.result.prompt_tokens += reply.prompt_tokens
        self.result.completion_tokens += reply.completion_tokens
        text = without_repeats(reply.content)
        if not text:  # a server that still constrained the reply to a call: take finish's summary
            text = " ".join(str(c.arguments.get("summary", "")) for c in reply.tool_calls).strip()
        self.result.status, self.result.summary = ("answered", text) if text else ("failed", "")
        self._emit("answered" if text else "no answer", status=self.result.status)

    def _emit(self, action: str, status: str = "working") -> None:
        tokens = self.result.prompt_tokens + self.result.completion_tokens
        self.on_event(AgentStep(self.part, self.index, self.result.steps, action, tokens, status))
