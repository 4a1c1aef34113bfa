"""Splits a thinking model's reply into its thinking and its answer.

A model named with `-thinking` (models.md) writes its reasoning between markers its tokenizer
knows (`<think>` … `</think>` for Qwen; mlx-lm's TokenizerWrapper names them), or its template
opens the block in the prompt so the reply starts inside it. Each API hands the thinking on in
its own field — OpenAI's `reasoning_content` (as vLLM and llama.cpp), Anthropic's `thinking`
blocks, Ollama's `thinking`, a Responses `reasoning` item — and the answer alone as the reply,
so tools neither show the reasoning as the answer nor parse calls out of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from locals.server.toolcalls import partial_suffix


@dataclass
class Thinking:
    """A piece of the model's reasoning."""

    text: str


@dataclass(frozen=True)
class ThinkMarkers:
    start: str
    end: str


def markers_of(loaded) -> ThinkMarkers | None:
    """The thinking markers of a model whose name asked for thinking, else None."""
    tokenizer = loaded.tokenizer
    if not getattr(loaded, "thinking", False) or not getattr(tokenizer, "has_thinking", False):
        return None
    return ThinkMarkers(tokenizer.think_start, tokenizer.think_end)


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
