"""The planner: one schema-constrained call that splits the task into ordered parts.

The server constrains the reply to PLAN_SCHEMA through `response_format`; a server that
ignores it may return anything, so the reply is validated and a bad plan falls back to
the whole task as one part (the note says so).
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from agents.events import Part, PlanReady
from agents.prompts import planner_messages
from locals.client import ChatClient, ClientError

MAX_AUTO_PARTS = 4


def plan_schema(parts: int | None) -> dict[str, Any]:
    """The JSON schema of a plan with `parts` parts (None: 1 to MAX_AUTO_PARTS)."""
    low, high = (1, MAX_AUTO_PARTS) if parts is None else (parts, parts)
    part = {
        "type": "object",
        "properties": {
            "goal": {"type": "string"},
            "files": {"type": "array", "items": {"type": "string"}},
            "depends_on": {"type": "array", "items": {"type": "integer"}},
        },
        "required": ["goal", "files", "depends_on"],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {"parts": {"type": "array", "items": part, "minItems": low, "maxItems": high}},
        "required": ["parts"],
        "additionalProperties": False,
    }


def single_part(task: str) -> list[Part]:
    return [Part(index=0, goal=task)]


async def make_plan(client: ChatClient, task: str, listing: str, parts: int | None,
                    session: str | None = None) -> PlanReady:
    """Ask the model for a plan; `parts` = None lets it choose how many. One part needs no call.
    `session` names the planner's conversation to the server (see ChatClient.chat)."""
    if parts == 1:
        return PlanReady(single_part(task))
    schema = plan_schema(parts)
    response_format = {"type": "json_schema", "json_schema": {"name": "plan", "schema": schema, "strict": True}}
    try:
        reply = await client.chat(planner_messages(task, listing, parts), response_format=response_format,
                                  temperature=0.0, max_tokens=400, session=session)
    except ClientError as exc:
        return PlanReady(single_part(task), note=f"planner failed ({_short(exc)}); running the task as one part")
    tokens = {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens}
    try:
        return PlanReady(parse_plan(reply.content, schema, task), **tokens)
    except (ValueError, jsonschema.ValidationError) as exc:
        note = f"planner reply unusable ({_short(exc)}); running the task as one part"
        return PlanReady(single_part(task), note=note, **tokens)


def parse_plan(text: str, schema: dict[str, Any], task: str) -> list[Part]:
    """Validate a planner reply and turn it into Parts; dependencies may only point backwards."""
    data = json.loads(text)
    jsonschema.validate(data, schema)
    if len(data["parts"]) == 1:
        return single_part(task)  # the task itself says it best
    parts = []
    for i, raw in enumerate(data["parts"]):
        goal = raw["goal"].strip() or task
        deps = sorted({d - 1 for d in raw["depends_on"] if 1 <= d <= i})
        files = [f.strip() for f in raw["files"] if f.strip()]
        parts.append(Part(index=i, goal=goal, files=files, depends_on=deps))
    return parts


def _short(exc: Exception) -> str:
    text = getattr(exc, "message", None) or str(exc)
    return text.splitlines()[0][:120] if text else type(exc).__name__
