"""The server's one door to the engine: turns an API-neutral `Chat` into a GenerationRequest,
streams the engine's events back as text pieces, tool calls and a final `Done`.

Only this module calls the engine (stream/cancel/stats) and the model helpers
(render_prompt, build_constraint); the API modules speak in `Chat` and the outputs below.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Literal, Protocol

from locals import toolloop
from locals.errors import RequestError, ServerStopping, TooLarge
from locals.protocol import (EngineStats, Event, FinishEvent, FinishReason, GenerationRequest, SamplingParams,
                             TokenLogprob, Usage)
from locals.server import overflow
from locals.server.activity import STEERED, Activity, RequestRecord
from locals.server.callers import Caller, caller_of, conversation_key, title_of
from locals.server.reply_tokens import ReplyTokens
from locals.server.reply_pieces import Piece, ReplyPieces
from locals.server.thinking import Thinking, ThinkingSplitter, can_think, markers_of, thinks
from locals.server.toolcalls import ToolCall, ToolCallSplitter, tool_format_of
from locals.server.typed_controls import TypedControls, encode_spans

if TYPE_CHECKING:
    from locals.engine import LoadedModel

log = logging.getLogger(__name__)
STOPPED_MESSAGE = "the server stopped before this reply was finished; send the request again once it is back"
TOO_LARGE_MESSAGE = "this request can never fit in the memory budget; shorten the prompt or lower max_tokens"
# What a request that names no reply limit gets unless the server sets one (`serve --max-tokens`):
# the memory guard reserves a request's prompt plus its limit, so "the rest of the context" would
# hold room a reply rarely uses (docs/how-it-works.md, "Guards").
DEFAULT_MAX_TOKENS = 4096
# A streamed reply silent this long (a long prompt still being read, a long tool call being
# written) sends its API's keep-alive, so that clients' idle timeouts do not fire and retry.
HEARTBEAT_S = 10.0


@dataclass
class Chat:
    """What every API request becomes: chat messages (HF chat-template shape) or a raw prompt."""

    api: str
    messages: list[dict] | None = None
    prompt: str | None = None
    tools: list[dict] | None = None  # OpenAI shape: {"type": "function", "function": {...}}
    tool_choice: Any = "auto"
    json_schema: dict | None = None
    strict_schema: bool = False  # the client asked for `strict` output: refuse rules it cannot enforce
    parallel_tool_calls: bool = True
    sampling: SamplingParams = field(default_factory=SamplingParams)
    prompt_tokens: int = 0  # set once prepared (Anthropic's message_start reports it)
    continue_final: bool = False  # the last message is the assistant's start (a prefill): continue it
    caller: Caller = field(default_factory=Caller)  # who sent it, for the conversations view
    overflow: str | None = None  # the request's own overflow policy (its `truncation`); None: the server's
    thinking: bool | None = None  # the request's own thinking switch; None: as the model's name asked

    @property
    def parses_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"


def chat_of(request, body: dict, api: str, **fields) -> Chat:
    """The Chat of one API request (`request`, its JSON `body`): who sent it and its own overflow
    policy (`truncation`) read alike for every API; the rest as that API gives it."""
    policy = overflow.policy_of_truncation(body.get("truncation"))
    return Chat(api=api, caller=caller_of(request, body), overflow=policy, **fields)


@dataclass
class Text:
    text: str
    logprobs: list[TokenLogprob] | None = None


# How a reply ended: the engine's finish reasons, "tool_calls" (the reply is tool calls) and
# "tool_loop" (the tool-loop guard ended it before the engine ran).
ReplyEnd = FinishReason | Literal["tool_calls", "tool_loop"]


class EnginePort(Protocol):
    """What the server asks of the engine (`locals.engine.Engine`; tests pass fakes)."""

    broken: str | None  # why the engine thread ended on its own; None while it runs

    def stream(self, request: GenerationRequest) -> AsyncIterator[Event]: ...

    def cancel(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...


@dataclass
class Done:
    reason: ReplyEnd
    usage: Usage
    error: str | None = None
    prompt_s: float = 0.0  # from the request reaching the engine to its first token
    stop_sequence: str | None = None  # the request's stop string that ended the reply
    cut_call: str | None = None  # the tool whose call the limit or a guard cut off (not handed on)

    def failure(self) -> tuple[str, str] | None:
        """(OpenAI's error type, message) when the reply failed — the engine's error, or a request
        that can never fit the memory budget (a 413 unstreamed) — else None. Streams send it as
        their API's error event, never as a plain finish that passes for an empty answer."""
        if self.reason == "memory":
            return "request_too_large", self.error or TOO_LARGE_MESSAGE
        if self.reason == "error":
            return "server_error", self.error or "generation failed"
        return None


Output = Text | Thinking | ToolCall | Done
ACCEPTED = object()  # `run(..., announce=True)` yields it once the request is prepared and queued


@dataclass
class Completion:
    """A whole reply, for non-streaming responses."""

    text: str
    calls: list[ToolCall]
    logprobs: list[TokenLogprob]
    done: Done
    thinking: str = ""  # a thinking model's reasoning (thinking.py)

    def raise_for_failure(self) -> None:
        """A request the engine could not serve becomes an HTTP error instead of a reply."""
        if self.done.reason == "memory":
            raise TooLarge(self.done.error or TOO_LARGE_MESSAGE)
        if self.done.reason == "error" and self.done.error == STOPPED_MESSAGE:
            raise ServerStopping(STOPPED_MESSAGE)
        if self.done.reason == "error":
            raise RuntimeError(self.done.error or "the engine failed on this request")


class Backend:
    """A loaded model plus its running engine, as the API modules see them."""

    def __init__(self, loaded: LoadedModel, engine: EnginePort, *, render: Callable | None = None,
                 constrain: Callable | None = None, activity: Activity | None = None,
                 boundaries: Callable | None = None, max_tokens: int | None = None,
                 overflow_policy: str = "refuse"):
        if render is None or constrain is None:
            from locals.engine import build_constraint, render_prompt
            render = render or render_prompt
            constrain = constrain or build_constraint
        if boundaries is None:
            from locals.engine import cache_points as boundaries
        self.loaded = loaded
        self.engine = engine
        self._render = render
        self._constrain = constrain
        self._boundaries = boundaries
        self.tool_format = tool_format_of(loaded)
        self.activity = activity or Activity()
        self.max_tokens = max_tokens  # the server's cap on any reply (`serve --max-tokens`), None: none
        self.overflow = overflow_policy  # what a conversation past the context gets (`serve --overflow`)
        self._replies = ReplyTokens()  # recent replies' own tokens, for the turns that send them back
        self._controls = TypedControls(loaded.tokenizer)

    @property
    def name(self) -> str:
        return self.loaded.name

    @property
    def default_max_tokens(self) -> int:
        """The reply limit of a request that names none: the server's `--max-tokens`, else 4,096."""
        return self.max_tokens or DEFAULT_MAX_TOKENS

    @property
    def model_id(self) -> str:
        return getattr(self.loaded, "model_id", None) or self.loaded.name

    @property
    def context_length(self) -> int:
        return int(getattr(self.loaded, "context_length", 0) or 0)

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def encode_text(self, text: str, messages: list[dict] | None = None) -> list[int]:
        """A rendered prompt's tokens: the replies among `messages` it holds in their own tokens
        (reply_tokens.py), the control tokens the other messages spell read as text (typed_controls.py)."""
        spans = []
        for message in messages or []:
            if message.get("role") == "assistant":
                reply = message.get("content")
                own = self._replies.tokens(reply) if isinstance(reply, str) and reply else None
                span = (reply, own) if own else None
            else:
                span = self._controls.span(message)
            if span:
                spans.append(span)
        return encode_spans(text, spans, lambda part: list(self.loaded.tokenizer.encode(part, add_special_tokens=False)))

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None,
                    continue_final: bool = False, thinking: bool | None = None) -> list[int]:
        if continue_final:
            try:
                text = self._render(self.loaded, messages, tools=tools or None, continue_final=True,
                                    thinking=thinking)
                return self.encode_text(text, messages)
            except Exception:  # a template that cannot leave its last message open: a new turn
                log.info("the chat template cannot continue a prefill; the reply starts a new turn")
        try:
            text = self._render(self.loaded, messages, tools=tools or None,
                                add_generation_prompt=True, thinking=thinking)
        except RequestError:
            raise
        except Exception as exc:  # a template that rejects these messages
            raise RequestError(f"the model's chat template rejected the messages: {exc}") from None
        return self.encode_text(text, messages)

    def token_text(self, token: int) -> str:
        return self.loaded.tokenizer.decode([token])

    def prepare(self, chat: Chat) -> GenerationRequest:
        """Tokenize and constrain a chat; RequestError for what cannot be served."""
        problem = chat.sampling.problem()
        if problem:
            raise RequestError(problem)
        if chat.tool_choice not in ("auto", "none") and not chat.tools:
            raise RequestError("`tool_choice` asks for a tool call but the request offers no `tools`")
        if not can_think(self.loaded):
            chat.thinking = None  # a switch the model cannot act on (its template may not know it)
        points: list[int] = []
        if chat.prompt is not None:
            tokens = list(self.loaded.tokenizer.encode(chat.prompt))
            if not tokens:  # a model without a start token has nothing to continue from
                raise RequestError("`prompt` is empty: send the text the model should continue")
        else:
            tokens = self._fit(chat, self._brief(chat, self.encode_chat(chat.messages or [], chat.tools,
                                                                       chat.continue_final, chat.thinking)))
            points = self._boundaries(self.loaded, chat.messages or [], chat.tools, tokens,
                                      encode=lambda text: self.encode_text(text, chat.messages))
        sampling = chat.sampling
        if self.context_length:
            room = self.context_length - len(tokens)
            if room <= 0:
                refusal = overflow.raw_refusal if chat.prompt is not None else overflow.refusal
                raise refusal(len(tokens), self.context_length)
            sampling.max_tokens = max(1, min(sampling.max_tokens, room))
        if self.max_tokens:
            sampling.max_tokens = min(sampling.max_tokens, self.max_tokens)
        constraint = None
        if chat.parses_tools or chat.json_schema is not None:
            constraint = self._constrain(
                self.loaded, tools=chat.tools if chat.parses_tools else None,
                tool_choice=chat.tool_choice if chat.parses_tools else "auto",
                json_schema=chat.json_schema, parallel_tool_calls=chat.parallel_tool_calls,
                max_tokens=sampling.max_tokens, strict_schema=chat.strict_schema)
        return GenerationRequest(prompt_tokens=tokens, sampling=sampling, constraint=constraint,
                                 cache_points=points,
                                 meta={"api": chat.api, "raw": chat.prompt is not None or chat.continue_final,
                                       "thinking": thinks(self.loaded, chat.thinking)})

    def _short_of_room(self, chat: Chat, tokens: list[int]) -> bool:
        """Whether the prompt leaves its reply too little of the window (overflow.needs_trimming)."""
        reply = min(chat.sampling.max_tokens, self.max_tokens or chat.sampling.max_tokens)
        return bool(self.context_length) and overflow.needs_trimming(len(tokens), self.context_length, reply)

    def _brief(self, chat: Chat, tokens: list[int]) -> list[int]:
        """A prompt that leaves its reply too little room rendered with the tools' descriptions
        cut to their first paragraph (chat.tools replaced, logged); otherwise `tokens` as they are."""
        if not (chat.tools and self._short_of_room(chat, tokens)):
            return tokens
        brief = overflow.briefed(chat.tools)
        if brief is None:
            return tokens
        shorter = self.encode_chat(chat.messages or [], brief, chat.continue_final, chat.thinking)
        log.warning("%s prompt of %d tokens is %d with its %d tools' descriptions cut to their first paragraph "
                    "(the %d-token context)", chat.api, len(tokens), len(shorter), len(brief), self.context_length)
        chat.tools = brief
        return shorter

    def _fit(self, chat: Chat, tokens: list[int]) -> list[int]:
        """Under the overflow policy `trim`, a conversation that leaves its reply too little room
        trimmed (chat.messages replaced, what went logged); otherwise `tokens` as they are."""
        if (chat.overflow or self.overflow) != "trim" or not self._short_of_room(chat, tokens):
            return tokens
        fitted = overflow.fit(
            chat.messages or [], lambda messages: self.encode_chat(messages, chat.tools, chat.continue_final,
                                                                   chat.thinking),
            lambda text: len(self.loaded.tokenizer.encode(text, add_special_tokens=False)), self.context_length)
        if len(fitted.tokens) >= self.context_length:
            raise overflow.unfittable(len(tokens), self.context_length, len(fitted.tokens))
        log.warning("%s prompt of %d tokens trimmed to %d for the %d-token context (overflow policy trim): "
                    "dropped %s", chat.api, len(tokens), len(fitted.tokens), self.context_length, fitted.summary())
        chat.messages = fitted.messages
        return fitted.tokens

    async def run(self, chat: Chat, announce: bool = False) -> AsyncIterator[Output]:
        """Stream a chat's outputs; closing the iterator early cancels it in the engine.
        With `announce`, ACCEPTED comes first once the request is valid (bad input raised before)."""
        steered = False
        if chat.messages and chat.tools:
            state, loop = toolloop.check(chat.messages)
            if state == "stop":
                log.warning("tool-call loop stopped: %s", loop.stop_message())
                self.activity.end(self._record(chat, f"toolloop-{uuid.uuid4().hex[:12]}", 0), "tool_loop", 0, 0)
                yield Text(loop.stop_message())
                yield Done("tool_loop", Usage())
                return
            if state == "steer":
                log.info("tool-call loop: steering away from %s", loop.name)
                steered = True
                chat.messages = _with_note(chat.messages, loop.steering_note())
        # Rendering, tokenizing and compiling a constraint take from ms to seconds: off the loop.
        request = await asyncio.to_thread(self.prepare, chat)
        chat.prompt_tokens = len(request.prompt_tokens)
        pieces = ReplyPieces(ToolCallSplitter(self.tool_format if chat.parses_tools else None, chat.tools),
                             self._thinking(request))
        record = self._record(chat, request.id, len(request.prompt_tokens))
        if steered:
            record.guards.append(STEERED)
        finish, usage = "cancelled", Usage(prompt_tokens=len(request.prompt_tokens))
        submitted, first_at, heard = time.perf_counter(), None, []
        try:
            if announce:
                yield ACCEPTED
            # aclosing: leaving early (client gone) closes the engine stream, which cancels.
            async with aclosing(self.engine.stream(request)) as events:
                async for event in events:
                    if isinstance(event, FinishEvent):
                        for piece in pieces.finish():
                            yield _wrap(piece)
                        done = self._done(event, pieces.calls > 0, (first_at or time.perf_counter()) - submitted,
                                          heard)
                        done.cut_call = pieces.cut.last(chat.api, request.id)
                        finish, usage = done.reason, done.usage
                        yield done
                        return
                    first_at = first_at or time.perf_counter()
                    self.activity.first_token(record)
                    usage.completion_tokens += len(event.tokens)
                    heard.append(event)
                    record.completion_tokens = usage.completion_tokens  # the dashboard's row counts as it goes
                    out = [_wrap(p) for p in pieces.feed(event)]
                    if event.logprobs and not any(isinstance(p, Text) for p in out):
                        out.insert(0, Text(""))
                    for piece in out:
                        if isinstance(piece, Text) and event.logprobs:
                            piece.logprobs, event.logprobs = event.logprobs, None
                        yield piece
        finally:
            record.tool_calls = pieces.calls
            self.activity.end(record, finish, usage.completion_tokens, usage.cached_tokens)
            if finish == "cancelled":  # the access log has no line for a request whose client left
                log.info("%s request %s cancelled: the client left after %d tokens", chat.api,
                         request.id, usage.completion_tokens)

    def _thinking(self, request: GenerationRequest) -> ThinkingSplitter | None:
        """A splitter for a thinking reply (thinking.py); None for other replies and raw prompts."""
        if request.meta.get("raw") or not request.meta.get("thinking"):  # `thinks`: only a model that can
            return None
        markers = markers_of(self.loaded)
        tail = self.loaded.tokenizer.decode(request.prompt_tokens[-16:])
        return ThinkingSplitter(markers, ThinkingSplitter.opens_in(tail, markers))

    def _done(self, event: FinishEvent, called: bool, prompt_s: float, heard: list) -> Done:
        """The reply's end as the APIs report it; a plain reply's tokens are kept for the turn
        that sends it back (reply_tokens.py)."""
        finish, error, stop = event.reason, event.error, event.detail.get("stop_sequence")
        if finish == "stop" and called:
            finish = "tool_calls"
        if finish == "cancelled":  # read by a client still here: the engine stopped under it
            finish, error = "error", STOPPED_MESSAGE
        if finish in ("stop", "length") and not stop:
            self._replies.remember("".join(e.text for e in heard), [t for e in heard for t in e.tokens],
                                   self.loaded.tokenizer.decode)
        return Done(finish, event.usage, error, prompt_s, stop)

    def _record(self, chat: Chat, request_id: str, prompt_tokens: int) -> RequestRecord:
        """The request's entry in the activity, under its caller's conversation."""
        return self.activity.begin(
            request_id, chat.api, prompt_tokens, client=chat.caller.client, session=chat.caller.session,
            conversation=conversation_key(chat.caller, chat.messages, chat.prompt),
            title=title_of(chat.messages, chat.prompt))

    async def complete(self, chat: Chat) -> Completion:
        """Run a chat to the end and gather its reply."""
        text, calls, logprobs, thinking = [], [], [], []
        done = Done("cancelled", Usage())
        async for out in self.run(chat):
            if isinstance(out, Text):
                text.append(out.text)
                logprobs.extend(out.logprobs or [])
            elif isinstance(out, Thinking):
                thinking.append(out.text)
            elif isinstance(out, ToolCall):
                calls.append(out)
            else:
                done = out
        return Completion("".join(text), calls, logprobs, done, "".join(thinking))


# Finish reasons of locals' own that each API reports as its plain stop, plus this detail.
GUARD_REASONS = {"loop", "tool_loop"}


def guard_detail(done: Done) -> dict:
    """{"locals": {"finish_reason": …}} when a guard ended the reply, and {"cut_tool_call": name}
    when a call was cut off; else {} (merged into replies)."""
    detail = {"finish_reason": done.reason} if done.reason in GUARD_REASONS else {}
    if done.cut_call:
        detail["cut_tool_call"] = done.cut_call
    return {"locals": detail} if detail else {}


def _with_note(messages: list[dict], note: str) -> list[dict]:
    """The conversation with `note` appended to its last message (a tool result or the user's)."""
    last = dict(messages[-1])
    content = last.get("content")
    if isinstance(content, list):
        last["content"] = [*content, {"type": "text", "text": "\n\n" + note}]
    else:
        last["content"] = f"{content or ''}\n\n{note}"
    return [*messages[:-1], last]


def _wrap(piece: Piece) -> Text | Thinking | ToolCall:
    return Text(piece) if isinstance(piece, str) else piece


class Started:
    """A running chat whose input was accepted, so bad input has raised (as a 4xx) before a
    streamed reply sends its 200; use with `contextlib.aclosing`. While no output comes for
    HEARTBEAT_S, iterating awaits `keep_alive` (set it once the stream is open)."""

    def __init__(self, outputs: AsyncIterator[Output], first: Output | None):
        self._outputs, self._first = outputs, first
        self._pending: asyncio.Future | None = None
        self.keep_alive: Callable[[], Awaitable[None]] | None = None

    async def __aiter__(self):
        if self._first is not None:
            yield self._first
        while True:
            # The next output is awaited in a task of its own, so that waiting for it can time
            # out without cancelling the chat (a cancelled `anext` would end the generator).
            self._pending = self._pending or asyncio.ensure_future(anext(self._outputs, None))
            done, _ = await asyncio.wait({self._pending}, timeout=HEARTBEAT_S)
            if not done:
                if self.keep_alive is not None:
                    await self.keep_alive()
                continue
            out, self._pending = self._pending.result(), None
            if out is None:
                return
            yield out
            if isinstance(out, Done):
                # The handler has written its last event: it ends the response without waiting on
                # the loop again, so a client that hangs up on that event is answered and logged.
                return

    async def aclose(self) -> None:
        """A client that left: cancels the request in the engine."""
        if self._pending is not None:
            self._pending.cancel()  # raises in the chat where it waits, which closes its engine stream
            await asyncio.gather(self._pending, return_exceptions=True)
            self._pending = None
        await self._outputs.aclose()


async def start(backend: Backend, chat: Chat) -> Started:
    """The chat started, once its request is prepared (a RequestError raises here, before any reply)."""
    outputs = backend.run(chat, announce=True)
    first = await anext(outputs)
    return Started(outputs, None if first is ACCEPTED else first)
