"""Property tests: the embedded model sampled at temperature 1.5 under the constraints.

Whatever the model wants, every output parses, validates against its schema, names only
offered tools, and still parses when cut off by a small max_tokens. The default run does
one quick batch; the slow run does 100+ generations per schema.
"""

from __future__ import annotations

import json
import random

import jsonschema
import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from locals.engine.constrain import build_constraint
from locals.engine.constrain.apply import apply_bitmasks
from locals.engine.load.templates import encode_prompt, render_prompt

pytestmark = pytest.mark.model
S = {"type": "string"}
BATCH = 26

PERSON = {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                           "email": S}, "required": ["name", "age"]}
NESTED = {"type": "object", "properties": {
    "title": S, "priority": {"enum": ["low", "mid", "high"]}, "done": {"type": "boolean"},
    "tags": {"type": "array", "items": S, "maxItems": 3},
    "owner": {"type": "object", "properties": {"id": {"type": "integer"}, "nick": S}, "required": ["id"]}},
    "required": ["title", "priority", "owner"]}
UNICODE = {"type": "object", "properties": {"word": {"enum": ["café", "naïve", "日本"]}, "note": S,
                                            "sym": {"const": "\u00e9\u0007"}}, "required": ["word", "note", "sym"]}


def fn(name, props, required):
    return {"type": "function", "function": {"name": name, "description": f"{name} tool",
                                             "parameters": {"type": "object", "properties": props,
                                                            "required": required}}}


CODING_TOOLS = [
    fn("read_file", {"path": S, "offset": {"type": "integer", "minimum": 0}}, ["path"]),
    fn("write_file", {"path": S, "content": S}, ["path", "content"]),
    fn("edit_file", {"path": S, "old": S, "new": S}, ["path", "old", "new"]),
    fn("list_dir", {"path": S, "recursive": {"type": "boolean"}}, ["path"]),
    fn("search", {"pattern": S, "glob": S}, ["pattern"]),
    fn("run", {"command": S, "timeout": {"type": "integer", "minimum": 1, "maximum": 600}}, ["command"]),
]


def generate(loaded, prompt, constraints, max_tokens, *, temperature=1.5, seed=0):
    """Sample one row per constraint from `prompt`; forced tokens are fed one per step."""
    batch = len(constraints)
    cache = make_prompt_cache(loaded.model)
    logits = loaded.model(mx.array([prompt]), cache=cache)[:, -1, :]
    for layer in cache:
        layer.keys = mx.repeat(layer.keys[..., : layer.offset, :], batch, axis=0)
        layer.values = mx.repeat(layer.values[..., : layer.offset, :], batch, axis=0)
    logits = mx.repeat(logits, batch, axis=0)
    mx.random.seed(seed)
    ones = mx.full(((loaded.vocab_size + 31) // 32,), 0xFFFFFFFF, dtype=mx.uint32)
    eos = loaded.tokenizer.eos_token_ids
    outs = [[] for _ in range(batch)]
    done = [False] * batch
    while not all(done):
        masks = mx.stack([m if (m := c.mask()) is not None else ones for c in constraints])
        masked = apply_bitmasks(logits.astype(mx.float32), masks)
        sampled = mx.random.categorical(masked / temperature).tolist()
        step = []
        for row, c in enumerate(constraints):
            token = 0
            if not done[row]:
                forced = c.forced_tokens()
                token = forced[0] if forced else sampled[row]
                c.accept(token)
                outs[row].append(token)
                done[row] = token in eos or c.is_complete() or len(outs[row]) >= max_tokens[row]
            step.append(token)
        logits = loaded.model(mx.array(step)[:, None], cache=cache)[:, -1, :]
    return [loaded.tokenizer.decode([t for t in out if t not in eos]) for out in outs]


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
def test_json_schemas_hold_over_100_generations(smollm2, schema):
    rng = random.Random(7)
    shortest = len(build_constraint(smollm2, json_schema=schema).closing_tokens())
    budgets = [rng.choice([rng.randint(shortest, 40), 64]) for _ in range(104)]
    run_json(smollm2, schema, 104, budgets, seed=11)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("choice", ["required", "auto"])
def test_coding_tools_hold_over_100_generations(smollm2, choice):
    rng = random.Random(8)
    budgets = [rng.choice([rng.randint(30, 60), 80]) for _ in range(104)]
    texts = run_tools(smollm2, choice, 104, budgets, seed=12)
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
