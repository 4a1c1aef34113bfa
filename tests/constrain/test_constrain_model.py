"""Property tests: the embedded model sampled at temperature 1.5 under the constraints.

Whatever the model wants, every output parses, validates against its schema, names only
offered tools, and still parses when cut off by a small max_tokens. The default run does
one quick batch; the slow run does `--generations` (104 unless told) per schema and tool choice.
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from locals.engine.constrain import build_constraint
from locals.engine.load.templates import encode_prompt, render_prompt

from tests.helpers.constrain_tools import CODING_TOOLS, PERSON, S, generate

pytestmark = pytest.mark.model
BATCH = 26

NESTED = {"type": "object", "properties": {
    "title": S, "priority": {"enum": ["low", "mid", "high"]}, "done": {"type": "boolean"},
    "tags": {"type": "array", "items": S, "maxItems": 3},
    "owner": {"type": "object", "properties": {"id": {"type": "integer"}, "nick": S}, "required": ["id"]}},
    "required": ["title", "priority", "owner"]}
UNICODE = {"type": "object", "properties": {"word": {"enum": ["café", "naïve", "日本"]}, "note": S,
                                            "sym": {"const": "\u00e9\u0007"}}, "required": ["word", "note", "sym"]}


def check_json(schema, texts):
    for text in texts:
        jsonschema.validate(json.loads(text), schema)


def check_calls(texts, names, *, expect_call: bool):
    calls = 0
    for text in texts:
        blocks = text.split("<tool_call>")[1:]
        assert not expect_call or blocks, text
        for block in blocks:
            assert "</tool_call>" in block, text
            call = json.loads(block.split("</tool_call>")[0])
            assert set(call) == {"name", "arguments"} and call["name"] in names, text
            params = next(t["function"]["parameters"] for t in CODING_TOOLS if t["function"]["name"] == call["name"])
            jsonschema.validate(call["arguments"], params)
            calls += 1
    return calls


def run_json(loaded, schema, n, budgets, seed):
    prompt = encode_prompt(loaded, render_prompt(loaded, [
        {"role": "user", "content": f"Reply with JSON for this schema: {json.dumps(schema)}"}]))
    texts = []
    for start in range(0, n, BATCH):
        rows = budgets[start:start + BATCH]
        cs = [build_constraint(loaded, json_schema=schema, max_tokens=b) for b in rows]
        texts += generate(loaded, prompt, cs, rows, seed=seed + start)
    check_json(schema, texts)
    return texts


def run_tools(loaded, choice, n, budgets, seed):
    prompt = encode_prompt(loaded, render_prompt(loaded, [
        {"role": "user", "content": "Read README.md, then list the src folder and run the tests."}], tools=CODING_TOOLS))
    texts = []
    for start in range(0, n, BATCH):
        rows = budgets[start:start + BATCH]
        cs = [build_constraint(loaded, tools=CODING_TOOLS, tool_choice=choice, max_tokens=b) for b in rows]
        if choice == "none":
            assert cs == [None] * len(rows)
            return []
        texts += generate(loaded, prompt, cs, rows, seed=seed + start)
    return texts


def test_quick_json_batch_parses_at_high_temperature(smollm2):
    rng = random.Random(1)
    shortest = len(build_constraint(smollm2, json_schema=PERSON).closing_tokens())
    run_json(smollm2, PERSON, 4, [rng.randint(shortest, 24) for _ in range(4)], seed=1)


@pytest.mark.slow
def test_quick_tool_batch_parses_at_high_temperature(smollm2):
    # A required call needs room for the shortest call (about 25 tokens here).
    rng = random.Random(2)
    texts = run_tools(smollm2, "required", 6, [rng.randint(30, 40) for _ in range(6)], seed=2)
    assert check_calls(texts, {t["function"]["name"] for t in CODING_TOOLS}, expect_call=True) >= 6


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("schema", [PERSON, NESTED, UNICODE], ids=["person", "nested", "unicode"])
def test_json_schemas_hold_over_many_generations(smollm2, schema, request):
    n = request.config.getoption("--generations", 104)
    rng = random.Random(7)
    shortest = len(build_constraint(smollm2, json_schema=schema).closing_tokens())
    budgets = [rng.choice([rng.randint(shortest, 40), 64]) for _ in range(n)]
    assert len(run_json(smollm2, schema, n, budgets, seed=11)) == n


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("choice", ["required", "auto"])
def test_coding_tools_hold_over_many_generations(smollm2, choice, request):
    n = request.config.getoption("--generations", 104)
    rng = random.Random(8)
    budgets = [rng.choice([rng.randint(30, 60), 80]) for _ in range(n)]
    texts = run_tools(smollm2, choice, n, budgets, seed=12)
    assert len(texts) == n
    check_calls(texts, {t["function"]["name"] for t in CODING_TOOLS}, expect_call=choice == "required")


def test_a_budget_below_the_shortest_output_is_refused(smollm2):
    from locals.errors import RequestError

    shortest = len(build_constraint(smollm2, json_schema=PERSON).closing_tokens())
    assert build_constraint(smollm2, json_schema=PERSON, max_tokens=shortest) is not None
    with pytest.raises(RequestError, match="shortest valid output"):
        build_constraint(smollm2, json_schema=PERSON, max_tokens=shortest - 1)
    with pytest.raises(RequestError, match="raise max_tokens"):
        build_constraint(smollm2, tools=CODING_TOOLS, tool_choice="required", max_tokens=5)


def test_tool_choice_none_never_constrains(smollm2):
    assert run_tools(smollm2, "none", 4, [16] * 4, seed=3) == []
