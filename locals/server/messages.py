"""Converts each API's messages and tools into the one shape chat templates take:
`{"role", "content": str, "tool_calls": [{"id", "type": "function", "function": {"name",
"arguments": dict}}], "tool_call_id", "name"}` and OpenAI-style function tools.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from locals.errors import RequestError

_TEXT_PARTS = {"text", "input_text", "output_text"}


def text_of(content: Any, where: str) -> str:
    """The text of a message content: a string, or a list of text parts (others refused)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(f"{where}: content must be a string or an array of parts")
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict):
            raise RequestError(f"{where}: each content part must be an object")
        kind = part.get("type", "text")
        if not isinstance(kind, str):
            raise RequestError(f"{where}: a content part's `type` must be a string")
        if kind in _TEXT_PARTS or kind == "refusal":
            field = "refusal" if kind == "refusal" else "text"
            if not isinstance(part.get(field), str):
                raise RequestError(f"{where}: a {kind} part needs a string `{field}`")
            texts.append(part[field])
        elif kind in ("image_url", "input_image", "image", "input_audio", "file", "input_file"):
            raise RequestError(f"{where}: this model reads text only; remove the {kind} part")
        else:  # a part the model would never read: say so rather than drop it
            raise RequestError(f"{where}: unknown content part type {kind!r}; text goes in a \"text\" part")
    return "".join(texts)


def parse_arguments(arguments: Any, where: str) -> dict:
    """Tool-call arguments as a dict; clients send them as a JSON string or an object."""
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except ValueError:
            raise RequestError(f"{where}: tool call arguments are not valid JSON") from None
        if isinstance(value, dict):
            return value
    raise RequestError(f"{where}: tool call arguments must be a JSON object")


def assistant_call(call_id: Any, name: Any, arguments: Any, where: str) -> dict:
    if not isinstance(name, str) or not name:
        raise RequestError(f"{where}: a tool call needs a `name`")
    if call_id is not None and not isinstance(call_id, str):
        raise RequestError(f"{where}: a tool call's `id` must be a string")
    return {"id": call_id or "", "type": "function",
            "function": {"name": name, "arguments": parse_arguments(arguments, where)}}


def openai_messages(messages: Any) -> list[dict]:
    """OpenAI chat messages (system/developer/user/assistant/tool) in template shape."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("`messages` must be a non-empty array")
    out, names = [], {}
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise RequestError(f"{where} must be an object")
        role = msg.get("role")
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant", "tool"):
            raise RequestError(f"{where}.role must be system, developer, user, assistant or tool")
        if role in ("system", "user") and msg.get("content") is None:
            raise RequestError(f"{where}.content is required for a {msg.get('role')} message")
        item = {"role": role, "content": text_of(msg.get("content"), where)}
        if role == "assistant" and msg.get("tool_calls"):
            calls = msg["tool_calls"]
            if not isinstance(calls, list):
                raise RequestError(f"{where}.tool_calls must be an array")
            item["tool_calls"] = []
            for call in calls:
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict):
                    raise RequestError(f"{where}.tool_calls entries need a `function` object")
                call_id = call.get("id")
                item["tool_calls"].append(assistant_call(call_id, fn.get("name"), fn.get("arguments"), where))
                names[call_id] = fn.get("name")
        if role == "tool":
            call_id = msg.get("tool_call_id")
            if call_id is not None and not isinstance(call_id, str):
                raise RequestError(f"{where}.tool_call_id must be a string")
            item["tool_call_id"] = call_id or ""
            name = msg.get("name")
            item["name"] = name if isinstance(name, str) and name else names.get(call_id, "")
        out.append(item)
    return out


def function_tool(name: Any, description: Any, parameters: Any, where: str) -> dict:
    if not isinstance(name, str) or not name:
        raise RequestError(f"{where}: a tool needs a `name`")
    if parameters is not None and not isinstance(parameters, dict):
        raise RequestError(f"{where}: tool parameters must be a JSON schema object")
    if parameters and parameters.get("type", "object") != "object":
        raise RequestError(f"{where}: tool parameters must be a JSON schema of type \"object\" "
                           "(a call's arguments are an object)")
    return {"type": "function", "function": {
        "name": name, "description": description if isinstance(description, str) else "",
        "parameters": parameters or {"type": "object", "properties": {}}}}


def client_tools(tools: Any, parts: Callable[[dict, str], tuple | None]) -> list[dict] | None:
    """A request's `tools` (an array of objects) as OpenAI function tools, None when there are none;
    `parts(tool, where)` gives a tool's (name, description, parameters), or None for a tool that is
    not the client's to run (a provider's built-in server tool), which is skipped."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise RequestError("`tools` must be an array")
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise RequestError(f"{where} must be an object")
        fields = parts(tool, where)
        if fields is not None:
            out.append(function_tool(*fields, where))
    return out or None


def openai_tools(tools: Any) -> list[dict] | None:
    """Chat Completions (and Responses) tools; tools other than functions (built-in server tools) are skipped."""
    return client_tools(tools, _openai_tool_parts)


def _openai_tool_parts(tool: dict, where: str) -> tuple | None:
    if tool.get("type", "function") != "function":
        return None
    fn = tool.get("function", tool)  # the Responses API puts the fields at the top level
    if not isinstance(fn, dict):
        raise RequestError(f"{where}.function must be an object")
    return fn.get("name"), fn.get("description"), fn.get("parameters")


def openai_tool_choice(value: Any) -> Any:
    """"auto" / "none" / "required" or {"type": "function", "function": {"name": ...}}."""
    if value is None:
        return "auto"
    if value in ("auto", "none", "required"):
        return value
    if isinstance(value, dict):
        fn = value.get("function")
        name = (fn.get("name") if isinstance(fn, dict) else None) or value.get("name")
        if isinstance(name, str) and name:
            return {"type": "function", "function": {"name": name}}
    raise RequestError("`tool_choice` must be auto, none, required or a named function")


def strict_response_format(fmt: Any) -> bool:
    """Whether a `json_schema` response format sets `strict: true` (OpenAI's own strict mode
    refuses what it cannot enforce; so does locals then)."""
    holder = fmt.get("json_schema", fmt) if isinstance(fmt, dict) else None
    return isinstance(holder, dict) and holder.get("strict") is True


def schema_of_response_format(fmt: Any) -> dict | None:
    """The JSON schema a `response_format` (chat) or `text.format` (responses) asks for."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise RequestError("`response_format` must be an object")
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        holder = fmt.get("json_schema", fmt)
        schema = holder.get("schema") if isinstance(holder, dict) else None
        if not isinstance(schema, dict):
            raise RequestError("`response_format.json_schema.schema` must be a JSON schema object")
        return schema
    raise RequestError(f"`response_format.type` {kind!r} is not one of text, json_object, json_schema")
