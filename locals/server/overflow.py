"""The overflow policy: what the server does with a conversation longer than the model's context.

`refuse` (the default) answers 400 with the prompt's length, the context and how to turn
trimming on. `trim` (`locals serve --overflow trim`, or a request's `"truncation": "auto"`,
the Responses API's field for this) keeps every system message, the last user message and
the newest exchange (the last assistant turn with its tool results), and frees room oldest
first: each older tool result's text becomes a marker saying how many tokens it held, then,
if that is not enough, older exchanges go whole. Like llama.cpp's context shift it frees
more than the overflow at once (down to TRIM_TO of the window), so the next turns fit
without trimming again and the trimmed prompt's prefix stays in the prefix cache meanwhile.
Before either policy, a prompt whose tools' descriptions push it past the room is rendered
with each description cut to its first paragraph (`briefed`): no message is lost, and the
conversation may then fit (Claude Code on a 16k window). Pure functions over template-shaped
messages and tools: the caller renders and tokenizes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable

from locals.errors import ContextOverflow, RequestError

POLICIES = ("refuse", "trim")
TRUNCATION = {"auto": "trim", "disabled": "refuse"}  # the request field's values → policies
TRIM_TO = 0.75  # a trimmed prompt takes at most this share of the window
REPLY_SHARE = 8  # with `trim`, a prompt leaving under 1/8 of the window (or max_tokens) is trimmed


@dataclass
class Dropped:
    """One message trimmed: its index in the request, role, tool name and estimated tokens."""

    index: int
    role: str
    name: str
    tokens: int
    whole: bool  # the message went; otherwise only a tool result's text did

    def __str__(self) -> str:
        what = f"tool result of {self.name or 'a tool'}" if self.role == "tool" else f"{self.role} message"
        return f"{'' if self.whole else 'the text of '}{what} #{self.index} (~{self.tokens} tokens)"


@dataclass
class Fitted:
    """The conversation as it will be rendered, its tokens, and what was dropped from it."""

    messages: list[dict]
    tokens: list[int]
    dropped: list[Dropped] = field(default_factory=list)

    def summary(self) -> str:
        return "; ".join(str(d) for d in self.dropped)


def policy_of_truncation(value) -> str | None:
    """The policy a request's `truncation` field asks for (None: the server's own)."""
    if value is None:
        return None
    if not isinstance(value, str) or value not in TRUNCATION:
        raise RequestError("`truncation` must be \"auto\" (drop the oldest tool results when the "
                           "conversation outgrows the context) or \"disabled\"")
    return TRUNCATION[value]


def briefed(tools: list[dict]) -> list[dict] | None:
    """The tools with each description cut to its first paragraph (the later ones are usage
    notes and examples: Claude Code's 21 tools take ~16,100 tokens, ~6,900 briefed); None when no
    description has more than one."""
    out, cut = [], False
    for tool in tools:
        function = tool.get("function") or {}
        text = function.get("description")
        if isinstance(text, str) and "\n\n" in text.strip():
            tool = {**tool, "function": {**function, "description": text.strip().split("\n\n", 1)[0]}}
            cut = True
        out.append(tool)
    return out if cut else None


def needs_trimming(prompt: int, context: int, max_tokens: int) -> bool:
    """Whether a prompt leaves the reply too little room: less than max_tokens or 1/8 of the window."""
    return context - prompt < min(max_tokens, context // REPLY_SHARE)


def refusal(prompt: int, context: int) -> ContextOverflow:
    return ContextOverflow(prompt, context, (
        "the overflow policy is `refuse`: shorten the conversation, or let the server drop the oldest "
        "tool results: start it with `locals start --overflow trim`, or send `\"truncation\": \"auto\"` "
        "with the request"))


def raw_refusal(prompt: int, context: int) -> ContextOverflow:
    return ContextOverflow(prompt, context, "a raw prompt is the client's own text and is never trimmed: shorten it")


def unfittable(prompt: int, context: int, kept: int) -> ContextOverflow:
    return ContextOverflow(prompt, context, (
        f"the overflow policy `trim` dropped every older tool result and message, and the system prompt "
        f"with the newest turn still takes {kept} tokens: use a model with a longer context (`--model qwen`)"))


def fit(messages: list[dict], encode: Callable[[list[dict]], list[int]], count: Callable[[str], int],
        context: int) -> Fitted:
    """The conversation trimmed until its prompt takes at most TRIM_TO of `context`, or as far as
    the kept messages allow (the caller checks that the result fits)."""
    target = int(context * TRIM_TO)
    keep = _kept(messages)
    stubs = [i for i, m in enumerate(messages) if m.get("role") == "tool" and i not in keep]
    groups = [g for g in _exchanges(messages) if not keep.intersection(g)]
    sizes = [count(_text_of(m)) for m in messages]
    state = _Trim(messages, context)
    tokens = encode(messages)
    estimate = len(tokens)
    steps = [(state.stub, i, sizes[i] - count(state.marker(sizes[i]))) for i in stubs]
    steps += [(state.remove, g, sum(sizes[i] for i in g)) for g in groups]
    for step, what, saves in steps:
        if estimate <= target:
            tokens = encode(state.messages())
            if len(tokens) <= target:
                break
            estimate = len(tokens)
        step(what, sizes)
        estimate -= saves
    else:
        tokens = encode(state.messages())
    return Fitted(state.messages(), tokens, state.dropped)


class _Trim:
    """The trimming so far: tool results stubbed, messages removed."""

    def __init__(self, messages: list[dict], context: int):
        self.original, self.context = messages, context
        self.stubbed: dict[int, str] = {}
        self.removed: set[int] = set()
        self.dropped: list[Dropped] = []

    def marker(self, tokens: int) -> str:
        return (f"[the server dropped this tool result ({tokens} tokens) to fit the model's "
                f"{self.context}-token context]")

    def stub(self, index: int, sizes: list[int]) -> None:
        self.stubbed[index] = self.marker(sizes[index])
        self.dropped.append(_dropped(self.original, index, sizes[index], whole=False))

    def remove(self, group: list[int], sizes: list[int]) -> None:
        self.removed.update(group)
        self.dropped.extend(_dropped(self.original, i, sizes[i], whole=True) for i in group)

    def messages(self) -> list[dict]:
        out = []
        for i, message in enumerate(self.original):
            if i in self.removed:
                continue
            if i in self.stubbed:
                message = {**message, "content": self.stubbed[i]}
            out.append(message)
        if self.removed:  # the note goes on the first message after the system prompt
            first = next(i for i, m in enumerate(out) if m.get("role") != "system")
            note = (f"[the server dropped {len(self.removed)} earlier messages to fit the model's "
                    f"{self.context}-token context]\n\n")
            out[first] = {**out[first], "content": note + (out[first].get("content") or "")}
        return out


def _dropped(messages: list[dict], index: int, tokens: int, whole: bool) -> Dropped:
    message = messages[index]
    return Dropped(index, message.get("role", ""), message.get("name") or _called(messages, index), tokens, whole)


def _called(messages: list[dict], index: int) -> str:
    """The name of the tool whose call the tool result at `index` answers ("" when unknown)."""
    call_id = messages[index].get("tool_call_id")
    for message in reversed(messages[:index]):
        for call in message.get("tool_calls") or []:
            if call.get("id") == call_id:
                return (call.get("function") or {}).get("name") or ""
    return ""


def _exchanges(messages: list[dict]) -> list[list[int]]:
    """Indices grouped so that removing a group keeps the conversation well formed: each user
    (or system) message alone, each assistant message with the tool results after it."""
    groups: list[list[int]] = []
    for i, message in enumerate(messages):
        if message.get("role") == "tool" and groups and messages[groups[-1][0]].get("role") in ("assistant", "tool"):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _kept(messages: list[dict]) -> set[int]:
    """What is never trimmed: system messages, the last user message, the newest exchange."""
    keep = {i for i, m in enumerate(messages) if m.get("role") == "system"}
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if users:
        keep.add(users[-1])
    groups = _exchanges(messages)
    if groups:
        keep.update(groups[-1])
    return keep


def _text_of(message: dict) -> str:
    calls = message.get("tool_calls")
    return (message.get("content") or "") + (json.dumps(calls) if calls else "")
