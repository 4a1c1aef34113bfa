"""Constrained decoding costs: step time at B=8 with all rows constrained vs none, mask time,
compile time per schema, first-seen 24-tool latency, and the share of jump-forward tokens.

Step time is measured twice: a plain decode loop over the model (mask built and applied
between forward passes, each timed on its own), and the engine itself (`engine_*`: rows
constrained or not, interleaved rounds), which is what a server runs. The engine also runs
a write_file tool whose content is a long string, where masked rows may queue the next
pass before their token is read, against the same rows always reading first (`*_sync`).

Also the compile time of one tool's call automaton in each tool-call format, and the tool-call
parse rate: coding requests offered four tools, sampled, constrained (tool_choice "required",
as locals serves it) and not (the same engine and prompts, as a server that does not constrain
decodes them); a reply counts when the server's own parser reads a call of an offered tool with
its required arguments from it. Writes benchmarks/results/constraint-<device>-<time>.json.

Run: python benchmarks/constraint.py [--model smollm2] [--steps 32] [--engine-tokens 400] [--rounds 3]
     python benchmarks/constraint.py --parse-only    # the parse rate alone (a minute on a CPU)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import write_results  # noqa: E402
from locals.engine.load.backend import needs_fast_blas_reexec, reexec_with_fast_blas  # noqa: E402
from locals.engine.constrain import build_constraint  # noqa: E402
from locals.engine.constrain.apply import apply_bitmasks
from locals.engine.constrain.schema import schema_regex
from locals.engine.constrain.vocab import token_vocab
from locals.engine.load.models import load_model
from locals.engine.load.templates import encode_prompt, render_prompt

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
    """Mean seconds per decode step, host seconds per mask build+apply, and the jump-forward share."""
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
            # Host time to build the masks and queue their application; the device part
            # runs inside the step's own evaluation, as in the engine.
            masked = apply_bitmasks(logits, mx.stack([c.mask() for c in cs]))
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


WRITE_FILE = [fn("write_file", {"path": S, "content": S}, ["path", "content"])]
WRITE_PROMPT = "Write a Python module with three functions and docstrings, and save it with write_file."


def engine_step_times(engine, loaded, prompt, batch: int, tokens: int, mode: str) -> dict:
    """A started engine at `batch` rows (a finished one is replaced by a new request), in `mode`:
    "free" (no tools), "constrained" (6 tools, tool_choice required), "auto" (6 tools, free
    text until a call starts) or "long" (one write_file tool, required: long string values):
    seconds per engine step and tokens per second."""
    from locals.protocol import FinishEvent, GenerationRequest, SamplingParams, TokenEvent

    tools = WRITE_FILE if mode == "long" else tool_set("bench", 6)
    done, lock = threading.Event(), threading.Lock()
    state = {"tokens": 0, "open": 0, "steps0": 0, "t0": 0.0}

    def submit() -> None:
        choice = {"constrained": "required", "auto": "auto", "long": "required"}.get(mode)
        c = build_constraint(loaded, tools=tools, tool_choice=choice, max_tokens=10_000) if choice else None
        state["open"] += 1
        engine.submit(GenerationRequest(prompt, SamplingParams(max_tokens=96), constraint=c), sink)

    def sink(ev) -> None:
        with lock:
            if isinstance(ev, TokenEvent):
                if not state["t0"]:  # the first row has read its prompt: time steps from here
                    state["t0"], state["steps0"] = time.perf_counter(), engine.counters.steps
                state["tokens"] += len(ev.tokens)
            elif isinstance(ev, FinishEvent):
                state["open"] -= 1
                if ev.error:
                    state["error"] = ev.error
                    done.set()
                elif state["tokens"] < tokens:
                    submit()  # keep the batch full
                elif state["open"] == 0:
                    state["t1"], state["steps1"] = time.perf_counter(), engine.counters.steps
                    done.set()

    with lock:
        for _ in range(batch):
            submit()
    done.wait()
    if "error" in state:
        raise RuntimeError(f"a request failed: {state['error']}")
    elapsed, steps = state["t1"] - state["t0"], state["steps1"] - state["steps0"]
    return {"s_per_step": elapsed / steps, "tokens_per_s": state["tokens"] / elapsed, "steps": steps}


def engine_runs(loaded, prompts: dict[str, list[int]], batch: int, tokens: int, rounds: int) -> dict:
    """Free and constrained engine runs interleaved over `rounds` on one engine: medians and ranges.
    `prompts`: "bench" (the 6 tools' prompt) and "long" (write_file's)."""
    from locals.engine.bench import without_eos
    from locals.engine.engine import Engine
    from locals.engine.settings import EngineConfig

    loaded = without_eos(loaded)  # free rows decode their whole budget, like constrained ones
    engine = Engine(loaded, EngineConfig(max_batch=batch, speculate=False))
    engine.start()
    runs = {"free": [], "constrained": [], "auto": [], "constrained_sync": [], "long": [], "long_sync": []}
    masked_steps = dict.fromkeys(runs, 0)
    try:
        engine_step_times(engine, loaded, prompts["bench"], batch, batch * 8, "constrained")  # warm: shapes, automata
        for _ in range(rounds):
            for name in runs:
                # *_sync: the same rows, each step built only after the one before is read
                engine.config.pipeline_masks = not name.endswith("_sync")
                mode = name.removesuffix("_sync")
                before = engine.counters.masks_after_total
                prompt = prompts["long" if mode == "long" else "bench"]
                runs[name].append(engine_step_times(engine, loaded, prompt, batch, tokens, mode))
                masked_steps[name] += engine.counters.masks_after_total - before
    finally:
        engine.stop()
    results = {"engine_masks_after_steps": " ".join(f"{k}={v}" for k, v in masked_steps.items() if v)}
    for name, rs in runs.items():
        per_step = sorted(r["s_per_step"] for r in rs)
        results[f"engine_s_per_step_{name}"] = statistics.median(per_step)
        results[f"engine_s_per_step_{name}_range"] = f"{per_step[0]:.4f}-{per_step[-1]:.4f}"
        results[f"engine_tokens_per_s_{name}"] = statistics.median(r["tokens_per_s"] for r in rs)
    # Constrained steps also carry jump-forward tokens (several per row), so they are heavier
    # per step and lighter per token: both ratios are kept.
    results["engine_step_time_ratio"] = results["engine_s_per_step_constrained"] / results["engine_s_per_step_free"]
    results["engine_tokens_per_s_ratio"] = (results["engine_tokens_per_s_constrained"]
                                            / results["engine_tokens_per_s_free"])
    # Tools offered, tool_choice auto: free text runs ahead of its last token like a free row.
    results["engine_auto_step_time_ratio"] = results["engine_s_per_step_auto"] / results["engine_s_per_step_free"]
    results["engine_sync_tokens_per_s_ratio"] = (results["engine_tokens_per_s_constrained_sync"]
                                                 / results["engine_tokens_per_s_free"])
    # Long string values: the rule queues the next pass first; *_sync reads first.
    results["engine_long_tokens_per_s_ratio"] = (results["engine_tokens_per_s_long"]
                                                 / results["engine_tokens_per_s_long_sync"])
    results["engine_taken_back_tokens"] = engine.stats().extra["taken_back_tokens"]
    return results


PARSE_TOOLS = [fn("read_file", {"path": S}, ["path"]), fn("list_files", {"path": S}, ["path"]),
               fn("run_command", {"command": S}, ["command"]),
               fn("search", {"pattern": S, "path": S}, ["pattern"])]
PARSE_ASKS = ("Read README.md.", "List the files in src.", "Run the test suite.", "Find where parse_date is defined.",
              "Show me the contents of setup.py.", "What files are in the docs folder?",
              "Run python -m pytest -q tests/repo/test_cli.py.", "Search the project for TODO comments.")
PARSE_SAMPLES = 2  # replies per ask and mode, each its own seed
PARSE_SAMPLING = {"temperature": 0.7, "max_tokens": 128}


def parses(loaded, text: str) -> bool:
    """Whether the server's parser reads at least one call from `text`, each naming an offered tool
    and giving its required arguments."""
    from locals.server.toolcalls import ToolCallSplitter, tool_format_of

    splitter = ToolCallSplitter(tool_format_of(loaded), PARSE_TOOLS)
    splitter.feed(text)
    splitter.finish()
    required = {t["function"]["name"]: t["function"]["parameters"]["required"] for t in PARSE_TOOLS}
    return bool(splitter.calls) and all(c.name in required and all(k in c.arguments for k in required[c.name])
                                        for c in splitter.calls)


def parse_rate(loaded, batch: int) -> dict:
    """The share of replies that parse, constrained and not: every ask PARSE_SAMPLES times a mode,
    all submitted at once to one engine of `batch` rows."""
    from locals.engine.engine import Engine
    from locals.engine.settings import EngineConfig
    from locals.protocol import FinishEvent, GenerationRequest, SamplingParams, TokenEvent

    jobs = [(constrained, i) for constrained in (True, False) for i in range(len(PARSE_ASKS) * PARSE_SAMPLES)]
    texts: dict[tuple[bool, int], list[str]] = {job: [] for job in jobs}
    finished, errors, done, lock = set(), [], threading.Event(), threading.Lock()

    def sink_for(job):
        def sink(ev) -> None:
            with lock:
                if isinstance(ev, TokenEvent):
                    texts[job].append(ev.text)
                elif isinstance(ev, FinishEvent):
                    finished.add(job)
                    if ev.error:
                        errors.append(ev.error)
                    if len(finished) == len(jobs):
                        done.set()
        return sink

    engine = Engine(loaded, EngineConfig(max_batch=batch))
    engine.start()
    try:
        for constrained, i in jobs:
            messages = [{"role": "user", "content": PARSE_ASKS[i % len(PARSE_ASKS)]}]
            prompt = encode_prompt(loaded, render_prompt(loaded, messages, tools=PARSE_TOOLS))
            c = build_constraint(loaded, tools=PARSE_TOOLS, tool_choice="required",
                                 max_tokens=PARSE_SAMPLING["max_tokens"]) if constrained else None
            engine.submit(GenerationRequest(prompt, SamplingParams(seed=i, **PARSE_SAMPLING), constraint=c),
                          sink_for((constrained, i)))
        done.wait()
    finally:
        engine.stop()
    if errors:
        raise RuntimeError(f"a request failed: {errors[0]}")
    rate = {mode: statistics.fmean(parses(loaded, "".join(texts[job])) for job in jobs
                                   if job[0] == (mode == "constrained")) for mode in ("constrained", "free")}
    return {"tool_call_parse": {"requests": len(jobs) // 2, "tools": len(PARSE_TOOLS), **PARSE_SAMPLING, **rate}}


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
    parser.add_argument("--engine-tokens", type=int, default=400,
                        help="tokens per engine run (constrained requests are replaced as they finish)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (loop and engine)")
    parser.add_argument("--steps-only", action="store_true", help="skip the compile-time measurements")
    parser.add_argument("--parse-only", action="store_true", help="measure the tool-call parse rate alone")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    if needs_fast_blas_reexec():
        reexec_with_fast_blas()  # the CPU numbers assume OpenBLAS, like the CLI
    loaded = load_model(args.model)
    token_vocab(loaded.tokenizer, loaded.vocab_size)
    results = {"model": loaded.name, "batch": args.batch, **parse_rate(loaded, args.batch)}
    if args.parse_only:
        finish(results, args.json)
        return
    if not args.steps_only:
        results.update(compile_times(loaded))
    prompt = encode_prompt(loaded, render_prompt(loaded, [{"role": "user", "content": "List the files."}],
                                                 tools=tool_set("bench", 6)))
    step_times(loaded, prompt, args.batch, 4, True)  # warm: compiles, device tables
    loops = {False: [], True: []}
    for _ in range(args.rounds):  # interleaved: drift hits both alike
        for constrained in loops:
            loops[constrained].append(step_times(loaded, prompt, args.batch, args.steps, constrained))
    free = statistics.median(r[0] for r in loops[False])
    constrained, mask_s, forced = (statistics.median(r[i] for r in loops[True]) for i in range(3))
    results.update(step_s_unconstrained=free, step_s_constrained=constrained,
                   overhead=constrained / free - 1, mask_s_per_step=mask_s, jump_forward_share=forced,
                   loop_overheads=" ".join(f"{c[0] / f[0] - 1:+.3f}" for f, c in zip(loops[False], loops[True])))
    # The same through the engine (pipelined steps, masks on the device inside the step).
    long_prompt = encode_prompt(loaded, render_prompt(loaded, [{"role": "user", "content": WRITE_PROMPT}],
                                                      tools=WRITE_FILE))
    results.update(engine_runs(loaded, {"bench": prompt, "long": long_prompt}, args.batch, args.engine_tokens,
                               args.rounds))
    finish(results, args.json)


def finish(results: dict, json_path: str | None) -> None:
    for key, value in results.items():
        print(f"{key:44} {value:.4f}" if isinstance(value, float) else f"{key:44} {value}")
    print("wrote", write_results("constraint", results))
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
