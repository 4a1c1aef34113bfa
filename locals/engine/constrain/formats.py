"""Tool-call formats: the frame around each call, as regexes, keyed by mlx-lm tool-parser name.

A format gives two regexes: the *head* (start marker up to the function name and just
past it, over all offered names; small, compiled at once) and the *call* (one whole call
of one named function with its arguments' regex). Both start with the same literal text,
so the bytes the head has read can be replayed into the call automaton once the name is
known. Each shape is exactly what the matching mlx-lm parser reads back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from locals.errors import RequestError

_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


@dataclass(frozen=True)
class ToolFormat:
    """One tool-call shape; `marker` starts a call in free text, the name follows `name_intro`."""

    parser: str  # mlx-lm tool parser module name
    marker: bytes
    name_intro: bytes
    name_end: bytes
    head_pattern: str  # {names}: alternation of escaped names
    call_pattern: str  # {name}, {args}

    def head_regex(self, names: list[str]) -> str:
        return self.head_pattern.format(names="|".join(re.escape(n) for n in names))

    def call_regex(self, name: str, args_regex: str) -> str:
        return self.call_pattern.format(name=re.escape(name), args=args_regex)


# Qwen2.5/Qwen3/SmolLM2 (and the server's own injected tool prompt): mlx-lm json_tools,
# `json.loads` of the text between the tags. An optional newline separates parallel calls.
HERMES = ToolFormat(
    parser="json_tools",
    marker=b"<tool_call>",
    name_intro=b'"name": "',
    name_end=b'"',
    head_pattern=r'\n?<tool_call>\n\{{"name": "({names})", "arguments": ',
    call_pattern=r'\n?<tool_call>\n\{{"name": "{name}", "arguments": {args}\}}\n</tool_call>',
)

# Mistral: `[TOOL_CALLS]name[ARGS]{json}`, which mlx-lm's mistral parser reads call by call.
MISTRAL = ToolFormat(
    parser="mistral",
    marker=b"[TOOL_CALLS]",
    name_intro=b"[TOOL_CALLS]",
    name_end=b"[",
    head_pattern=r"\[TOOL_CALLS\]({names})\[ARGS\]",
    call_pattern=r"\[TOOL_CALLS\]{name}\[ARGS\]{args}",
)

FORMATS = {f.parser: f for f in (HERMES, MISTRAL)}


def tool_format(parser: str | None) -> ToolFormat | None:
    """The format for a model's mlx-lm tool parser name (None: no constrained format for it)."""
    return FORMATS.get(parser or "json_tools")


def check_name(name) -> str:
    """A function name usable inside a call frame, or RequestError saying what is wrong."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise RequestError(f"tool name {name!r} is not valid: use 1-128 letters, digits, '_', '-', '.' or ':'")
    return name
