"""Constrained decoding costs: step time at B=8 with all rows constrained vs none, mask time,
compile time per schema, first-seen 24-tool latency, and the share of jump-forward tokens.

Also the compile time of one tool's call automaton in each tool-call format. Writes
benchmarks/results/constraint-<device>-<time>.json.

Run: python benchmarks/constraint.py [--model smollm2] [--steps 32] [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import uuid
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import write_results  # noqa: E402
from locals.engine.backend import needs_fast_blas_reexec, reexec_with_fast_blas  # noqa: E402
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


def edit_tools(tag: str, n: int) -> list[dict]:
    """Coding-agent tools with several free-text strings (edit_file-like)."""
    return [fn(f"{tag}_{i}", {"path": S, "old": S, "new": S, "limit": {"type": "integer", "minimum": 0}},
               ["path", "old", "new"]) for i in range(n)]


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
    tool = tool_set("x", 1)[0]["function"]
    # qwen3_coder_inline: free-text values as regex states (the design before value holes).
    for key, parser, holes in (("json_tools", "json_tools", False), ("qwen3_coder", "qwen3_coder", True),
                               ("qwen3_coder_inline", "qwen3_coder", False), ("llama3_json", "llama3_json", False)):
        fmt = FORMATS[parser]
        regex = fmt.call_regex(tool["name"], fmt.arguments_regex(tool["parameters"], parser, holes=holes))
        t0 = time.perf_counter()
        index = compiler.compile_regex(regex + f"(#{uuid.uuid4().hex[:8]})?", vocab, label=parser)
        out[f"one_tool_call_{key}"] = time.perf_counter() - t0
        out[f"one_tool_transitions_{key}"] = sum(len(r) for r in index.index.get_transitions().values())
    out.update(tool_set_compile(loaded, "json_tools", tool_set, "24_tools"))
    for parser in ("json_tools", "qwen3_coder"):
        out.update(tool_set_compile(loaded, parser, edit_tools, f"24_edit_tools_{parser}"))
    return out


def tool_set_compile(loaded, parser: str, make, name: str) -> dict:
    """A first-seen 24-tool set in one format: ready (head compiled, first mask), then every
    tool's call automaton compiled (what the background does), and their transitions."""
    loaded = dataclasses.replace(loaded, tool_format=parser)
    t0 = time.perf_counter()
    c = build_constraint(loaded, tools=make("t" + uuid.uuid4().hex[:6], 24), tool_choice="required")
    c.mask()
    ready = time.perf_counter() - t0
    transitions = sum(len(r) for tool in c._tools.names
                      for r in c._tools.call(tool).index.index.get_transitions().values())
    return {f"first_seen_{name}": ready, f"all_calls_compiled_{name}": time.perf_counter() - t0,
            f"all_calls_transitions_{name}": transitions}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    if needs_fast_blas_reexec():
        reexec_with_fast_blas()  # the CPU numbers assume OpenBLAS, like the CLI
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
        print(f"{key:44} {value:.4f}" if isinstance(value, float) else f"{key:44} {value}")
    print("wrote", write_results("constraint", results))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
