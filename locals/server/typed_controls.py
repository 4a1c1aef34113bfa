"""Control tokens that a client's text spells are read as text, not as controls.

A chat template writes the turn markers itself (`<|im_start|>`, `<|im_end|>`), and the rendered
prompt is tokenized with special tokens parsed so that those markers become their tokens. The same
spelling inside a message would become the real marker too: a file an agent reads, or a page it
fetches, could close its turn and open a system one. So the text of every message but the
assistant's (whose tokens the model wrote) is tokenized with special tokens as plain text, wherever
the rendered prompt holds that text verbatim. Messages that spell no control token, nearly all,
are left to the ordinary path and cost one regular-expression search each.
"""

from __future__ import annotations

import re
from collections.abc import Callable


class TypedControls:
    """The tokenizer's control-token spellings, and a message's text read with them as text."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        hf = getattr(tokenizer, "_tokenizer", tokenizer)  # mlx-lm's wrapper holds the HF tokenizer
        added = getattr(hf, "added_tokens_decoder", None) or {}
        spellings = sorted({t.content for t in added.values() if getattr(t, "special", False) and len(t.content) > 1},
                           key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, spellings))) if spellings else None

    def span(self, message: dict) -> tuple[str, list[int]] | None:
        """(text, tokens) for a client-written message whose text spells a control token: the text
        (its surrounding whitespace left to the template's side) and its tokens with every special
        token read as plain text. None for the assistant's messages and for text that spells none."""
        text = message.get("content")
        if self._pattern is None or message.get("role") == "assistant" or not isinstance(text, str):
            return None
        text = text.strip()
        if not self._pattern.search(text):
            return None
        return text, list(self._tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))


def encode_spans(text: str, spans: list[tuple[str, list[int] | tuple[int, ...]]],
                 encode: Callable[[str], list[int]]) -> list[int]:
    """`text` tokenized: each of `spans` ((text, tokens), in the order the text holds them) that the
    text holds, from where the last one ended, spelled with its tokens; the rest by `encode`. A span
    the text does not hold (a template that rewrote it) is left to `encode`."""
    tokens: list[int] = []
    start = 0
    for span, own in spans:
        at = text.find(span, start)
        if at < 0:
            continue
        tokens += encode(text[start:at]) if at > start else []
        tokens += own
        start = at + len(span)
    return tokens + encode(text[start:]) if start < len(text) else tokens
