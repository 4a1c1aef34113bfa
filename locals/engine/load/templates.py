"""Render chat messages (and offered tools) into the prompt text the model expects.

Models whose chat template renders tools keep their own format. For templates that do
not (the embedded SmolLM2's ChatML), the tools are described in the system message and
calls use the hermes shape `<tool_call>{"name": …, "arguments": …}</tool_call>`, which
mlx-lm's json_tools parser reads and the constraint package enforces.
"""

from __future__ import annotations

import json
from typing import Any

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"

_TOOLS_PREAMBLE = """# Tools

You can call functions to help with the request. The functions you may call are
described, one JSON signature per line, between <tools> and </tools>:
<tools>
{signatures}
</tools>

To call a function, answer with a JSON object holding its name and its arguments
between <tool_call> and </tool_call>, like this:
<tool_call>
{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}
</tool_call>"""


def text_of(content: Any) -> str:
    """Message content as plain text: strings pass; OpenAI/Anthropic text parts are joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
            parts.append(part.get("text", ""))
    return "".join(parts)


def tools_system_text(tools: list[dict]) -> str:
    """The system-prompt section that offers `tools` in the hermes format."""
    signatures = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
    return _TOOLS_PREAMBLE.format(signatures=signatures)


def format_tool_call(call: dict) -> str:
    """An OpenAI-shaped tool call ({"function": {"name", "arguments"}}) as a hermes block."""
    fn = call.get("function", call)
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            pass
    body = json.dumps({"name": fn.get("name", ""), "arguments": args}, ensure_ascii=False)
    return f"{TOOL_CALL_START}\n{body}\n{TOOL_CALL_END}"


def _inject_tools(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """Messages rewritten for a template without tool support (hermes conventions)."""
    out: list[dict] = []
    for msg in messages:
        role, text = msg.get("role", "user"), text_of(msg.get("content"))
        if role == "assistant" and msg.get("tool_calls"):
            calls = "\n".join(format_tool_call(c) for c in msg["tool_calls"])
            out.append({"role": "assistant", "content": f"{text}\n{calls}".strip()})
        elif role == "tool":
            block = f"<tool_response>\n{text}\n</tool_response>"
            if out and out[-1]["role"] == "user" and out[-1].get("_tool"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool": True})
        else:
            out.append({"role": role, "content": text})
    for msg in out:
        msg.pop("_tool", None)
    if tools:
        section = tools_system_text(tools)
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{section}".strip()
        else:
            out.insert(0, {"role": "system", "content": section})
    return out


def _normalize(messages: list[dict]) -> list[dict]:
    """Messages with text content, keeping tool fields the model's own template reads."""
    out = []
    for msg in messages:
        m = dict(msg)
        m["content"] = text_of(msg.get("content"))
        if m.get("tool_calls"):
            m["tool_calls"] = [_parsed_arguments(c) for c in m["tool_calls"]]
        out.append(m)
    return out


def _parsed_arguments(call: dict) -> dict:
    """Templates expect arguments as a mapping; OpenAI sends a JSON string."""
    fn = dict(call.get("function", {}))
    if isinstance(fn.get("arguments"), str):
        try:
            fn["arguments"] = json.loads(fn["arguments"] or "{}")
        except ValueError:
            pass
    return {**call, "function": fn}


def render_prompt(loaded, messages: list[dict], tools: list[dict] | None = None,
                  add_generation_prompt: bool = True, continue_final: bool = False,
                  thinking: bool | None = None) -> str:
    """The prompt text for `messages` (OpenAI-shaped) and `tools` on this model; `continue_final`:
    the last (assistant) message left open for the reply to continue (a prefill); `thinking`: the
    request's own choice (None: as the model's name asked)."""
    tokenizer = loaded.tokenizer
    kwargs: dict[str, Any] = {"add_generation_prompt": add_generation_prompt and not continue_final,
                              "tokenize": False}
    if continue_final:
        kwargs["continue_final_message"] = True
    # Said either way: Qwen3's templates think unless told not to, and mlx-lm's tokenizer wrapper
    # turns thinking on for any vocabulary with <think>. Off unless the name asked for it
    # (`qwen-thinking`) or the request: a past turn's thinking is dropped from the prompt, so
    # thinking replies would also lose their KV at every turn.
    kwargs["enable_thinking"] = bool(loaded.thinking) if thinking is None else thinking
    if loaded.tools_in_template:
        return tokenizer.apply_chat_template(_normalize(messages), tools=tools or None, **kwargs)
    return tokenizer.apply_chat_template(_inject_tools(messages, tools), **kwargs)


def encode_prompt(loaded, text: str) -> list[int]:
    """Token ids of a rendered prompt (the template already holds any special tokens)."""
    return loaded.tokenizer.encode(text, add_special_tokens=False)


def cache_points(loaded, messages: list[dict], tools: list[dict] | None, tokens: list[int],
                 encode=None) -> list[int]:
    """Token counts where `tokens` (the whole rendered prompt) ends a message boundary worth caching.

    The system prompt (with the tools) and everything before the last message: the next
    turn of the same conversation, or another agent with the same system prompt, starts
    with one of these. A boundary is kept only if its rendering, tokenized by `encode` (the one
    that made `tokens`; default `encode_prompt`), is a true token prefix.
    """
    encode = encode or (lambda text: encode_prompt(loaded, text))
    ends = {k for k in (1 if messages and messages[0].get("role") == "system" else 0,
                        len(messages) - 1) if 0 < k < len(messages)}
    points = []
    for k in sorted(ends):
        try:
            prefix = encode(render_prompt(loaded, messages[:k], tools, add_generation_prompt=False))
        except Exception:  # a template that refuses a partial conversation: no boundary there
            continue
        if 0 < len(prefix) < len(tokens) and tokens[: len(prefix)] == prefix:
            points.append(len(prefix))
    return points
