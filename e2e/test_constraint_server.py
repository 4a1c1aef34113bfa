"""The constraint property test through a real daemon and the official `openai` client.

Temperature 1.5 on the embedded model, requests sent from a few threads at once so the
engine batches constrained and unconstrained rows together. Every tool call names an
offered tool and its arguments parse and validate; every response_format reply parses and
validates; tool_choice="none" never yields a call; small max_tokens still give valid
output, with finish_reason "length" when the budget closed it (docs/arch/constraint.md).
"""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

from tests.helpers.constrain_tools import CODING_TOOLS, PERSON, S  # the same schemas as the engine-level test

pytestmark = pytest.mark.slow

NESTED = {"type": "object", "properties": {
    "title": S, "priority": {"type": "string", "enum": ["low", "mid", "high"]}, "done": {"type": "boolean"},
    "tags": {"type": "array", "items": S, "maxItems": 3},
    "owner": {"type": "object", "properties": {"id": {"type": "integer"}, "nick": S}, "required": ["id"]}},
    "required": ["title", "priority", "owner"]}
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in CODING_TOOLS}
TASK = [{"role": "user", "content": "Read README.md, list the src folder, then run the tests."}]
THREADS = 4


def _tools_request(client, max_tokens: int, seed: int):
    return client.chat.completions.create(
        model="smollm2", messages=TASK, tools=CODING_TOOLS, tool_choice="required", temperature=1.5,
        max_tokens=max_tokens, seed=seed)


def _json_request(client, schema: dict, max_tokens: int, seed: int):
    return client.chat.completions.create(
        model="smollm2", temperature=1.5, max_tokens=max_tokens, seed=seed,
        messages=[{"role": "user", "content": f"Give me JSON for: {json.dumps(schema)}"}],
        response_format={"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}})


def _in_threads(calls):
    with ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(lambda call: call(), calls))


@pytest.fixture(scope="module")
def client(locals_server):
    return openai.OpenAI(base_url=locals_server.openai_url, api_key="local", timeout=600)


def test_required_tool_calls_always_parse_and_validate(client):
    rng = random.Random(12)
    # About half with room to finish, half with a small budget that forces the closing.
    budgets = [rng.choice([rng.randint(36, 64), 160]) for _ in range(40)]
    replies = _in_threads([lambda b=b, i=i: _tools_request(client, b, i) for i, b in enumerate(budgets)])
    for budget, reply in zip(budgets, replies):
        choice = reply.choices[0]
        calls = choice.message.tool_calls or []
        # A call the budget cut off is not returned (its arguments are cut short); the reply names it.
        cut = ((reply.model_extra or {}).get("locals") or {}).get("cut_tool_call")
        assert calls or (choice.finish_reason == "length" and cut in PARAMS), \
            f"tool_choice=required gave no call and named none cut (budget {budget}): {choice.message.content!r}"
        assert choice.finish_reason in ("tool_calls", "length"), choice.finish_reason
        assert reply.usage.completion_tokens <= budget
        for call in calls:
            assert call.function.name in PARAMS, call.function.name
            jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])
    assert sum(1 for r in replies if r.choices[0].message.tool_calls) >= len(replies) // 2


@pytest.mark.parametrize("schema", [PERSON, NESTED], ids=["person", "nested"])
def test_response_format_replies_always_parse_and_validate(client, schema):
    rng = random.Random(13)
    budgets = [rng.choice([rng.randint(28, 48), 200]) for _ in range(20)]
    replies = _in_threads([lambda b=b, i=i: _json_request(client, schema, b, i) for i, b in enumerate(budgets)])
    for budget, reply in zip(budgets, replies):
        choice = reply.choices[0]
        assert choice.finish_reason in ("stop", "length"), choice.finish_reason
        assert reply.usage.completion_tokens <= budget
        jsonschema.validate(json.loads(choice.message.content), schema)


def test_tool_choice_none_never_yields_a_call(client):
    replies = _in_threads([lambda i=i: client.chat.completions.create(
        model="smollm2", messages=TASK, tools=CODING_TOOLS, tool_choice="none", temperature=1.5,
        max_tokens=48, seed=i) for i in range(8)])
    for reply in replies:
        assert not reply.choices[0].message.tool_calls
        assert reply.choices[0].finish_reason in ("stop", "length")


def test_a_budget_below_the_shortest_call_is_a_clear_400(client):
    with pytest.raises(openai.BadRequestError, match="raise max_tokens"):
        _tools_request(client, 5, 0)
