"""Splits a thinking model's reply into its thinking and its answer.

A model named with `-thinking` (models.md), or asked to think by the request (each API's own
switch, `Chat.thinking`), writes its reasoning between markers its tokenizer knows (`<think>`
… `</think>` for Qwen; mlx-lm's TokenizerWrapper names them), or its template opens the block
in the prompt so the reply starts inside it. Each API hands the thinking on in
its own field — OpenAI's `reasoning_content` (as vLLM and llama.cpp), Anthropic's `thinking`
blocks, Ollama's `thinking`, a Responses `reasoning` item — and the answer alone as the reply,
so tools neither show the reasoning as the answer nor parse calls out of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from locals.errors import RequestError
from locals.server.toolcalls import partial_suffix
from locals.server.wire import get


@dataclass
class Thinking:
    """A piece of the model's reasoning."""

    text: str


@dataclass(frozen=True)
class ThinkMarkers:
    start: str
    end: str


def can_think(loaded) -> bool:
    """Whether the model's tokenizer names thinking markers (mlx-lm's TokenizerWrapper)."""
    return bool(getattr(loaded.tokenizer, "has_thinking", False))


def thinks(loaded, asked: bool | None) -> bool:
    """Whether a reply thinks: as the request asked (None: as the model's name asked, `-thinking`),
    and only where the model can."""
    return can_think(loaded) and (bool(getattr(loaded, "thinking", False)) if asked is None else asked)


# Each API's own switch, read as on, off or unsaid (None: the model's name decides). An
# "adaptive" Anthropic request (Claude Code's default for a model it does not know) and a
# Responses request naming no effort (Codex's) leave it to the model.
_EFFORT = {"none": False, "minimal": False, "low": True, "medium": True, "high": True, "xhigh": True}


def _effort(value: Any, key: str) -> bool | None:
    if value is None:
        return None
    if value not in _EFFORT:
        raise RequestError(f"`{key}` must be one of {', '.join(_EFFORT)}, got {value!r}"[:200])
    return _EFFORT[value]


def asked_openai(body: dict, api: str) -> bool | None:
    """Chat Completions: `chat_template_kwargs.enable_thinking` (vLLM's, llama.cpp's), else
    `reasoning_effort`; Responses: `reasoning.effort`."""
    if api == "responses":
        return _effort(get(body, "reasoning", dict, {}).get("effort"), "reasoning.effort")
    kwargs = get(body, "chat_template_kwargs", dict, {})
    unknown = sorted(set(kwargs) - {"enable_thinking"})
    if unknown:
        raise RequestError(f"`chat_template_kwargs` takes `enable_thinking` only, not {', '.join(unknown)}"[:200])
    on = get(kwargs, "enable_thinking", bool)
    return on if on is not None else _effort(body.get("reasoning_effort"), "reasoning_effort")


def asked_anthropic(body: dict) -> bool | None:
    """`thinking.type`: enabled, disabled, or adaptive (the model's own default)."""
    kind = get(body, "thinking", dict, {}).get("type")
    choices = {"enabled": True, "disabled": False, "adaptive": None, None: None}
    if kind not in choices:
        raise RequestError(f"`thinking.type` must be enabled, disabled or adaptive, got {kind!r}"[:200])
    return choices[kind]


def asked_ollama(body: dict, loaded) -> bool | None:
    """`think`: true or false, or an effort (low, medium, high); a model that cannot think refuses
    true, as Ollama does."""
    value = body.get("think")
    on = _effort(value, "think") if isinstance(value, str) else get(body, "think", bool)
    if on and not can_think(loaded):
        raise RequestError(f'"{getattr(loaded, "name", "this model")}" does not support thinking')
    return on


def markers_of(loaded) -> ThinkMarkers | None:
    """The thinking markers of a model that can think, else None."""
    tokenizer = loaded.tokenizer
    return ThinkMarkers(tokenizer.think_start, tokenizer.think_end) if can_think(loaded) else None


class ThinkingSplitter:
    """Feed reply text in pieces; get back answer text (str) and Thinking pieces, in order.
    `open_in_prompt`: the template opened the block, so the reply starts inside it."""

    def __init__(self, markers: ThinkMarkers, open_in_prompt: bool):
        self.markers = markers
        self._inside = open_in_prompt
        self._done = False  # one block a reply: markers after it are the answer's text
        self._after_block = False  # the newlines a model writes after the block are not the answer
        self._buf = ""

    @staticmethod
    def opens_in(prompt: str, markers: ThinkMarkers) -> bool:
        """Whether `prompt` ends inside a thinking block its template opened."""
        return prompt.rfind(markers.start) > prompt.rfind(markers.end)

    def feed(self, text: str) -> list[str | Thinking]:
        self._buf += text
        if self._done:
            return self._answer()
        if not self._inside:  # before the block: only whitespace may come first
            at = self._buf.find(self.markers.start)
            before = self._buf[:at] if at >= 0 else self._buf[: len(self._buf) - partial_suffix(self._buf, self.markers.start)]
            if before.strip():
                self._done = True  # the answer began without thinking
                return self._answer()
            if at < 0:
                return []
            self._buf, self._inside = self._buf[at + len(self.markers.start):], True
        at = self._buf.find(self.markers.end)
        if at < 0:
            keep = partial_suffix(self._buf, self.markers.end)
            thought, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep:]
            return [Thinking(thought)] if thought else []
        thought, self._buf = self._buf[:at], self._buf[at + len(self.markers.end):]
        self._inside, self._done, self._after_block = False, True, True
        return ([Thinking(thought)] if thought else []) + self._answer()

    def _answer(self) -> list[str | Thinking]:
        rest, self._buf = self._buf, ""
        if self._after_block:
            rest = rest.lstrip("\n")
            self._after_block = not rest
        return [rest] if rest else []

    def finish(self) -> list[str | Thinking]:
        """The rest at the reply's end (a block never closed is thinking)."""
        rest, self._buf = self._buf, ""
        if self._inside:
            return [Thinking(rest)] if rest else []
        self._buf = rest
        return self._answer()
