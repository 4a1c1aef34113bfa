"""Constrained decoding costs: step time at B=8 with all rows constrained vs none, mask time,
compile time per schema, first-seen 24-tool latency, and the share of jump-forward tokens.

Also the compile time of one tool's call automaton in each tool-call format. Writes
benchmarks/results/constraint-<device>-<time>.json.

Run: python benchmarks/constraint.py [--model smollm2] [--steps 32] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import write_results  # noqa: E402
from locals.engine.constrain import build_constraint  # noqa: E402
from locals.engine.constrain.apply import apply_bitmasks
from locals.engine.constrain.schema import schema_regex
from locals.engine.constrain.vocab import token_vocab
from locals.engine.models import load_model
from locals.engine.templates import encode_prompt, render_prompt

S = {"type": "string"}


def fn(name, props, required):
    return {"type": "function", "function": {"name": name, "description": name, "parameters": {
        "type": "object", "properties": props, "required": required}}}


def tool_set(tag: str, n: int) -> list[dict]:
    return [fn(f"{tag}_{i}", {"path": S, "n": {"type": "integer", "minimum": 0}, "mode": {"enum": ["a", "b"]},
                              "tags": {"type": "array", "items": S}}, ["path"]) for i in range(n)]


def step_times(loaded, prompt, batch: int, steps: int, constrained: bool) -> tuple[float, float, float]:
    """Mean seconds per decode step, per mask build+apply, and the jump-forward share."""
    tools = tool_set("bench", 6)
    cs = [build_constraint(loaded, tools=tools, tool_choice="required", max_tokens=10_000) for _ in range(batch)]
    cache = make_prompt_cache(loaded.model)
    tokens = mx.array([prompt] * batch)
    logits = loaded.model(tokens, cache=cache)[:, -1, :]
    mx.eval(logits)
    forced_count, total, mask_s = 0, 0, 0.0
    start = time.perf_counter()
    for _ in range(steps):
        if constrained:
            t0 = time.perf_counter()
            masked = apply_bitmasks(logits, mx.stack([c.mask() for c in cs]))
            mx.eval(masked)
            mask_s += time.perf_counter() - t0
        else:
            masked = logits
        sampled = mx.argmax(masked, axis=-1).tolist()
        step = []
        for row, c in enumerate(cs):
            token = sampled[row]
            if constrained:
                forced = c.forced_tokens()
                if forced:
                    token, forced_count = forced[0], forced_count + 1
                if c.is_complete():  # start over so every step stays constrained
                    cs[row] = c = build_constraint(loaded, tools=tools, tool_choice="required", max_tokens=10_000)
                    token = c.forced_tokens()[0] if c.forced_tokens() else int(mx.argmax(apply_bitmasks(
                        logits[row:row + 1], c.mask()[None]), axis=-1).item())
                c.accept(token)
            step.append(token)
            total += 1
        logits = loaded.model(mx.array(step)[:, None], cache=cache)[:, -1, :]
        mx.eval(logits)
    elapsed = time.perf_counter() - start
    return elapsed / steps, mask_s / steps, forced_count / max(total, 1)


def compile_times(loaded) -> dict[str, float]:
    vocab = token_vocab(loaded.tokenizer, loaded.vocab_size)
    out = {}
    schemas = {"person": {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 0}},
                          "required": ["name", "age"]},
               "one_tool_args": tool_set("x", 1)[0]["function"]["parameters"]}
    from locals.engine.constrain import compile as compiler
    for name, schema in schemas.items():
        regex = schema_regex(schema, label=name) + f"(#{uuid.uuid4().hex[:8]})?"  # fresh: no cache hit
        t0 = time.perf_counter()
        compiler.compile_regex(regex, vocab, label=name)
        out[name] = time.perf_counter() - t0
    from locals.engine.constrain.formats import FORMATS
    for parser in ("json_tools", "qwen3_coder", "llama3_json"):
        fmt, tool = FORMATS[parser], tool_set("x", 1)[0]["function"]
        regex = fmt.call_regex(tool["name"], fmt.arguments_regex(tool["parameters"], parser))
        t0 = time.perf_counter()
        compiler.compile_regex(regex + f"(#{uuid.uuid4().hex[:8]})?", vocab, label=parser)
        out[f"one_tool_call_{parser}"] = time.perf_counter() - t0
    tag = "t" + uuid.uuid4().hex[:6]
    t0 = time.perf_counter()
    c = build_constraint(loaded, tools=tool_set(tag, 24), tool_choice="required")
    c.mask()
    out["first_seen_24_tools"] = time.perf_counter() - t0
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    loaded = load_model(args.model)
    token_vocab(loaded.tokenizer, loaded.vocab_size)
    results = {"model": loaded.name, "batch": args.batch, **compile_times(loaded)}
    prompt = encode_prompt(loaded, render_prompt(loaded, [{"role": "user", "content": "List the files."}],
                                                 tools=tool_set("bench", 6)))
    step_times(loaded, prompt, args.batch, 4, True)  # warm: compiles, device tables
    free, _, _ = step_times(loaded, prompt, args.batch, args.steps, False)
    constrained, mask_s, forced = step_times(loaded, prompt, args.batch, args.steps, True)
    results.update(step_s_unconstrained=free, step_s_constrained=constrained,
                   overhead=constrained / free - 1, mask_s_per_step=mask_s, jump_forward_share=forced)
    for key, value in results.items():
        print(f"{key:24} {value:.4f}" if isinstance(value, float) else f"{key:24} {value}")
    print("wrote", write_results("constraint", results))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
