"""Aggregate decode tok/s and time to first token at several batch sizes:
locals' engine against mlx-lm's BatchGenerator, same prompts, interleaved rounds.

    python benchmarks/batch_decode.py                      # CPU, embedded SmolLM2
    python benchmarks/batch_decode.py --random-model qwen3-4b --batches 1,2,4,8,16,32   # GPU
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import interleaved, load_pair, no_eos, prompts, summary, write_results  # noqa: E402


def _timing(submitted: float, firsts: list[float], ends: list[float], n_tokens: int, batch: int) -> dict:
    # Decode rate: tokens after the first, over the time from the last first token to the end,
    # so prompt reading does not count as decode time.
    start = max(firsts)
    end = max(ends)
    decode = batch * (n_tokens - 1) / max(end - start, 1e-9)
    ttft = sorted(f - submitted for f in firsts)
    return {"decode_tps": decode, "ttft_s": ttft[len(ttft) // 2], "wall_s": end - submitted}


def run_locals(engine, batch_prompts: list[list[int]], max_tokens: int) -> dict:
    from locals.protocol import FinishEvent, GenerationRequest, SamplingParams, TokenEvent

    done = threading.Event()
    firsts, ends, counts = {}, {}, {}
    lock = threading.Lock()

    def sink_for(i):
        def sink(ev):
            now = time.perf_counter()
            if isinstance(ev, TokenEvent) and ev.tokens:
                firsts.setdefault(i, now)
                counts[i] = counts.get(i, 0) + len(ev.tokens)
            elif isinstance(ev, FinishEvent):
                ends[i] = now
                with lock:
                    if len(ends) == len(batch_prompts):
                        done.set()
        return sink

    t0 = time.perf_counter()
    for i, p in enumerate(batch_prompts):
        engine.submit(GenerationRequest(p, SamplingParams(max_tokens=max_tokens)), sink_for(i))
    done.wait()
    assert all(c == max_tokens for c in counts.values()), counts
    return _timing(t0, list(firsts.values()), list(ends.values()), max_tokens, len(batch_prompts))


def run_mlx_lm(model, batch_prompts: list[list[int]], max_tokens: int) -> dict:
    from mlx_lm.generate import BatchGenerator

    gen = BatchGenerator(model, max_tokens=max_tokens, completion_batch_size=max(32, len(batch_prompts)))
    t0 = time.perf_counter()
    gen.insert(batch_prompts, [max_tokens] * len(batch_prompts))
    firsts, ends, counts = {}, {}, {}
    while len(ends) < len(batch_prompts):
        for r in gen.next_generated():
            now = time.perf_counter()
            firsts.setdefault(r.uid, now)
            counts[r.uid] = counts.get(r.uid, 0) + 1
            if r.finish_reason is not None:
                ends[r.uid] = now
    gen.close()
    assert all(c == max_tokens for c in counts.values()), counts
    return _timing(t0, list(firsts.values()), list(ends.values()), max_tokens, len(batch_prompts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--random-model", default=None, help="qwen3-4b: random 4-bit Qwen3-4B shape (GPU)")
    ap.add_argument("--batches", default="1,2,4,8,16")
    ap.add_argument("--tokens", type=int, default=32, help="tokens generated per request")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--with-lookup", action="store_true",
                    help="also run locals with prompt-lookup drafts on ('locals' runs without: this "
                         "benchmark measures batching; random weights repeat themselves, which drafts exploit)")
    ap.add_argument("--dense-baseline", action="store_true",
                    help="also run mlx-lm on locals' (dense) weights, to separate weights from scheduling")
    args = ap.parse_args()

    from locals.engine.engine import Engine
    from locals.engine.settings import EngineConfig

    ours, theirs, label = load_pair(args.random_model)
    ours = no_eos(ours)
    engine = Engine(ours, EngineConfig(prefix_cache_bytes=0, max_batch=256, speculate=False))
    engine.start()
    lookup = None
    if args.with_lookup:
        lookup = Engine(ours, EngineConfig(prefix_cache_bytes=0, max_batch=256))
        lookup.start()
    rows = []
    try:
        for batch in [int(b) for b in args.batches.split(",")]:
            ps = prompts(ours.tokenizer, batch, args.prompt_len, seed=batch)
            runners = {
                "locals": lambda: run_locals(engine, ps, args.tokens),
                "mlx-lm": lambda: run_mlx_lm(theirs, ps, args.tokens),
            }
            if lookup is not None:
                runners["locals-lookup"] = lambda: run_locals(lookup, ps, args.tokens)
            if args.dense_baseline and theirs is not ours.model:
                runners["mlx-lm-dense"] = lambda: run_mlx_lm(ours.model, ps, args.tokens)
            res = interleaved(args.rounds, runners)
            row = {"batch": batch}
            for name, runs in res.items():
                row[name] = {"decode_tps": summary([r["decode_tps"] for r in runs]),
                             "ttft_s": summary([r["ttft_s"] for r in runs])}
            rows.append(row)
            line = "  ".join(f"{n}: {row[n]['decode_tps']['median']:.1f} tok/s ttft {row[n]['ttft_s']['median']:.2f}s"
                             for n in res)
            print(f"B={batch:3d}  {line}", flush=True)
    finally:
        engine.stop()
        if lookup is not None:
            lookup.stop()
    path = write_results("batch_decode", {"model": label, "tokens": args.tokens, "prompt_len": args.prompt_len,
                                          "rounds": args.rounds, "rows": rows, "argv": sys.argv[1:]})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
