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

from locals.engine.constrain.schema import schema_regex
from locals.engine.constrain.xml_args import parameters_regex
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
    arguments: str = "json"  # "json": one JSON object; "xml": Qwen3-Coder parameter blocks
    avoid: tuple[str, ...] = ()  # markers no argument string may hold (they would end the call)
    parallel: bool = True  # several calls in one reply
    # A call may start only at the start of the reply (after blanks) or right after `reopen`
    # (a special token of its own, where the tokenizer has one); elsewhere the marker is text.
    start_only: bool = False
    reopen: bytes = b""

    def arguments_regex(self, schema, label: str, holes: bool = False) -> str:
        """The arguments' regex; `holes`: XML free-text values as runtime-checked holes (values.py)."""
        if self.arguments == "xml":
            return parameters_regex(schema, label=label, holes=holes)
        return schema_regex(schema, label=label, avoid=self.avoid)

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

# Qwen3-Coder / Qwen3.5: XML blocks, one `<parameter=…>` per argument (mlx-lm qwen3_coder),
# exactly as its chat template writes them; calls after the first start on a new line.
QWEN3_CODER = ToolFormat(
    parser="qwen3_coder",
    marker=b"<tool_call>",
    name_intro=b"<function=",
    name_end=b">",
    head_pattern=r"\n?<tool_call>\n<function=({names})>\n",
    call_pattern=r"\n?<tool_call>\n<function={name}>\n{args}</function>\n</tool_call>",
    arguments="xml",
)

# Llama 3.1/3.2/3.3: `{"name": …, "parameters": {…}}` as the whole reply, optionally after
# <|python_tag|>; its chat template holds one call per reply. A reply that shows JSON in
# prose is not a call: the call starts only at the start of the reply or after the tag. Read by mlx-lm's json_tools
# parser (json.loads), which the server applies after the `{"name": "` start marker.
LLAMA3_JSON = ToolFormat(
    parser="llama3_json",
    marker=b'{"name": "',
    name_intro=b'{"name": "',
    name_end=b'"',
    head_pattern=r'(<\|python_tag\|>)?\{{"name": "({names})", "parameters": ',
    call_pattern=r'(<\|python_tag\|>)?\{{"name": "{name}", "parameters": {args}\}}',
    parallel=False,
    start_only=True,
    reopen=b"<|python_tag|>",
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



def parse_llama3_call(body: str, tools=None):
    """mlx-lm's json_tools parser on a Llama 3 call whose `{"name": "` start marker the server's
    splitter has taken off (the call runs to the end of the reply: there is no end marker)."""
    from mlx_lm.tool_parsers import json_tools

    return json_tools.parse_tool_call(LLAMA3_JSON.marker.decode() + body, tools)


def is_llama3_json_template(template) -> bool:
    """A Llama 3.1+ chat template: custom tools answered as bare `{"name": …, "parameters": …}`."""
    return isinstance(template, str) and "<|python_tag|>" in template and '"parameters": ' in template


FORMATS = {f.parser: f for f in (HERMES, MISTRAL, QWEN3_CODER, LLAMA3_JSON)}


def tool_format(parser: str | None) -> ToolFormat | None:
    """The format for a model's mlx-lm tool parser name (None: no constrained format for it)."""
    return FORMATS.get(parser or "json_tools")


def check_name(name) -> str:
    """A function name usable inside a call frame, or RequestError saying what is wrong."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise RequestError(f"tool name {name!r} is not valid: use 1-128 letters, digits, '_', '-', '.' or ':'")
    return name
