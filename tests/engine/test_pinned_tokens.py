"""The embedded model's greedy answers, pinned token for token through the engine users run.

`create_engine` (prefix cache, guards, tuned-kernel routing, constraint warm-up) answers a chat
turn, a required tool call and a JSON-schema reply with exactly these ids. They were taken
before the engine was reorganised into rooms; a restructuring that changes one of them changed
behaviour, not just layout. On a CPU the ops are MLX's own and OpenBLAS (conftest re-executes
with it), so the ids hold on any Linux machine with the same MLX version.
"""

from __future__ import annotations

import pytest

from locals.engine import build_constraint, create_engine, encode_prompt, render_prompt
from locals.protocol import FinishEvent, GenerationRequest, SamplingParams, TokenEvent

pytestmark = pytest.mark.model

S = {"type": "string"}
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                            "parameters": {"type": "object", "properties": {"path": S},
                                                           "required": ["path"]}}},
         {"type": "function", "function": {"name": "run", "description": "Run a shell command",
                                            "parameters": {"type": "object", "properties": {"command": S},
                                                           "required": ["command"]}}}]
PERSON = {"type": "object", "properties": {"name": S, "age": {"type": "integer"}}, "required": ["name", "age"]}

# name -> (messages, constraint arguments, expected ids, expected finish reason)
CASES = {
    "chat": ([{"role": "user", "content": "What is the capital of France?"}], {},
             [504, 3575, 282, 4649, 314, 7042, 30], "stop"),
    "tool_call": ([{"role": "user", "content": "Show me the contents of setup.py"}],
                  {"tools": TOOLS, "tool_choice": "required"},
                  [44, 19324, 79, 4350, 46, 198, 39428, 1245, 1799, 476, 4215, 1002, 476, 24370, 1799, 9583, 9151,
                   1799, 13824, 17859, 198, 9617, 19324, 79, 4350, 46], "length"),
    "json_schema": ([{"role": "user", "content": "Describe a person called Ada who is 36, as JSON."}],
                    {"json_schema": PERSON},
                    [107, 18, 1245, 1799, 476, 4503, 81, 1002, 476, 473, 1799, 216, 35, 38, 109], "stop"),
}
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def engine(smollm2):
    eng = create_engine(smollm2)
    eng.start()
    yield eng
    eng.stop()


def answer(engine, loaded, messages, constraint_args) -> tuple[list[int], str]:
    prompt = encode_prompt(loaded, render_prompt(loaded, messages, constraint_args.get("tools")))
    constraint = build_constraint(loaded, max_tokens=MAX_TOKENS, **constraint_args) if constraint_args else None
    request = GenerationRequest(prompt, SamplingParams(max_tokens=MAX_TOKENS), constraint=constraint)
    events = list(engine.generate(request))
    tokens = [t for ev in events if isinstance(ev, TokenEvent) for t in ev.tokens]
    assert isinstance(events[-1], FinishEvent)
    return tokens, events[-1].reason


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_tokens_are_the_pinned_ones(engine, smollm2, case):
    messages, constraint_args, expected, reason = CASES[case]
    tokens, finish = answer(engine, smollm2, messages, constraint_args)
    assert (tokens, finish) == (expected, reason), smollm2.tokenizer.decode(tokens)
