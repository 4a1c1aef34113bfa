"""One agent rewriting a ~100-line Python file with one change: decode tok/s of locals with
prompt-lookup drafts, locals without them, and mlx-lm's stream_generate — and an unrelated
reply (a story), where drafts must not slow locals down. All greedy, same weights, one process.

    python benchmarks/rewrite.py                      # CPU, embedded model, 300 tokens
    python benchmarks/rewrite.py --tokens 900         # GPU: the whole file
"""

from __future__ import annotations

import argparse
import queue
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import as_peer, interleaved, summary, write_results  # noqa: E402

SHAPES = ["circle", "square", "triangle", "hexagon", "ellipse", "rectangle", "pentagon", "rhombus"]


def source_file() -> str:
    """A deterministic ~100-line Python module (the file the agent rewrites)."""
    lines = ['"""Geometry helpers for the drawing tool."""', "", "import math", ""]
    for i, shape in enumerate(SHAPES):
        lines += [
            "",
            f"class {shape.capitalize()}:",
            f'    """A {shape} with a size and a position."""',
            "",
            "    def __init__(self, size, x=0.0, y=0.0):",
            "        self.size = size",
            "        self.x, self.y = x, y",
            "",
            "    def area(self):",
            f"        return math.pi * self.size ** 2 / {i + 2}",
            "",
            "    def moved(self, dx, dy):",
            f"        return {shape.capitalize()}(self.size, self.x + dx, self.y + dy)",
        ]
    return "\n".join(lines) + "\n"


def rewrite_prompt(tokenizer) -> list[int]:
    text = ("Here is a Python file:\n\n```python\n" + source_file() + "```\n\n"
            "Rewrite the whole file, renaming the method `moved` to `shifted` everywhere. "
            "Output only the complete file in one ```python block.")
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)


def unrelated_prompt(tokenizer) -> list[int]:
    text = "Write a long story about a lighthouse keeper who learns to paint."
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)


def _rate(times: list[float]) -> float:
    """Decode tokens per second: tokens after the first over the time they took."""
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 0.0


def run_locals(engine, prompt: list[int], tokens: int) -> dict:
    from locals.protocol import FinishEvent, GenerationRequest, SamplingParams

    events: queue.Queue = queue.Queue()
    before = engine.stats().extra
    engine.submit(GenerationRequest(prompt, SamplingParams(temperature=0.0, max_tokens=tokens)), events.put)
    times, ids = [], []
    while True:
        ev = events.get()
        if isinstance(ev, FinishEvent):
            break
        now = time.perf_counter()
        # Drafted tokens arrive several per step: time each token at its arrival.
        for t in ev.tokens:
            times.append(now)
            ids.append(t)
    after = engine.stats().extra
    drafted = after["drafted_tokens"] - before["drafted_tokens"]
    accepted = after["accepted_draft_tokens"] - before["accepted_draft_tokens"]
    return {"decode_tps": _rate(times), "tokens": len(ids), "ids": ids,
            "acceptance": accepted / drafted if drafted else 0.0, "accepted": accepted}


@as_peer
def run_mlx_lm(model, tokenizer, prompt: list[int], tokens: int) -> dict:
    import mlx.core as mx
    from mlx_lm.generate import stream_generate

    times, ids = [], []
    for r in stream_generate(model, tokenizer, mx.array(prompt), max_tokens=tokens):
        times.append(time.perf_counter())
        ids.append(r.token)
        if r.finish_reason is not None:
            break
    return {"decode_tps": _rate(times), "tokens": len(ids), "ids": ids}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=300, help="tokens generated per request (most)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-draft", type=int, default=None, help="override EngineConfig.max_draft")
    args = ap.parse_args()

    from locals.engine.engine import Engine
    from locals.engine.load.models import load_model
    from locals.engine.settings import EngineConfig

    loaded = load_model("smollm2")
    configs = {"locals": EngineConfig(prefix_cache_bytes=0),
               "locals-no-lookup": EngineConfig(prefix_cache_bytes=0, speculate=False)}
    if args.max_draft is not None:
        configs["locals"].max_draft = args.max_draft
    engines = {name: Engine(loaded, config) for name, config in configs.items()}
    for e in engines.values():
        e.start()
    rows = []
    try:
        for case, prompt in (("rewrite", rewrite_prompt(loaded.tokenizer)),
                             ("unrelated", unrelated_prompt(loaded.tokenizer))):
            runners = {name: (lambda e=e: run_locals(e, prompt, args.tokens)) for name, e in engines.items()}
            runners["mlx-lm"] = lambda: run_mlx_lm(loaded.model, loaded.tokenizer, prompt, args.tokens)
            res = interleaved(args.rounds, runners)
            row = {"case": case, "prompt_tokens": len(prompt)}
            for name, runs in res.items():
                row[name] = {"decode_tps": summary([r["decode_tps"] for r in runs]),
                             "tokens": runs[0]["tokens"]}
                if "acceptance" in runs[0]:
                    row[name]["acceptance"] = summary([r["acceptance"] for r in runs])
            # Greedy with and without drafts must write the same tokens.
            row["same_output"] = res["locals"][0]["ids"] == res["locals-no-lookup"][0]["ids"]
            rows.append(row)
            line = "  ".join(f"{n}: {row[n]['decode_tps']['median']:.1f} tok/s" for n in res)
            print(f"{case:9s} ({row['locals']['tokens']} tokens)  {line}  "
                  f"acceptance {row['locals']['acceptance']['median']:.0%}  same output: {row['same_output']}",
                  flush=True)
    finally:
        for e in engines.values():
            e.stop()
    path = write_results("rewrite", {"model": "SmolLM2-135M (embedded), same weights for all",
                                     "max_draft": configs["locals"].max_draft,
                                     "tokens": args.tokens, "rounds": args.rounds, "rows": rows,
                                     "argv": sys.argv[1:]})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
