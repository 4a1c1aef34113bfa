"""A long prompt arriving while 4 streams decode: the longest gap between the streams' tokens
while it is read, and its time to first token — locals' engine against mlx-lm's BatchGenerator.

    python benchmarks/long_prompt.py                       # CPU: 2k-token prompt, both on dense f32
    python benchmarks/long_prompt.py --random-model qwen3-4b --long 8192   # GPU
    python benchmarks/long_prompt.py --random-model qwen3-4b --long 2048 --stream-len 6000   # as served agents
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import as_peer, interleaved, load_pair, no_eos, prompts, summary, write_results  # noqa: E402

STREAMS = 4
AFTER = 3  # stream tokens to see after the long prompt's first token before stopping
# Streams are cancelled long before this; it only sizes their KV reservation (admission).
STREAM_MAX_TOKENS = 4096


def _gaps(times: dict[int, list[float]], start: float, end: float) -> dict:
    """Longest gap between consecutive tokens of any stream overlapping [start, end], and the usual gap before."""
    longest, before = 0.0, []
    for ts in times.values():
        for a, b in zip(ts, ts[1:]):
            if b >= start and a <= end:
                longest = max(longest, b - a)
            elif b < start:
                before.append(b - a)
    return {"max_gap_s": longest, "usual_gap_s": statistics.median(before) if before else 0.0}


def run_locals(engine, streams: list[list[int]], long: list[int]) -> dict:
    from locals.protocol import GenerationRequest, SamplingParams, TokenEvent

    times: dict[int, list[float]] = {i: [] for i in range(STREAMS)}
    long_first: list[float] = []
    got_first = threading.Event()
    # Wake the waiting thread only when a stream reaches `need` tokens (no polling: the
    # benchmark must not take CPU from the engine).
    need = {"n": 3}
    reached = threading.Event()

    def on_stream(ev, i):
        if isinstance(ev, TokenEvent) and ev.tokens:
            times[i].append(time.perf_counter())
            if min(len(t) for t in times.values()) >= need["n"]:
                reached.set()

    reqs = [GenerationRequest(p, SamplingParams(max_tokens=STREAM_MAX_TOKENS)) for p in streams]
    for i, r in enumerate(reqs):
        engine.submit(r, lambda ev, i=i: on_stream(ev, i))
    reached.wait()

    def on_long(ev):
        if isinstance(ev, TokenEvent) and ev.tokens and not long_first:
            long_first.append(time.perf_counter())
            got_first.set()

    t0 = time.perf_counter()
    engine.submit(GenerationRequest(long, SamplingParams(max_tokens=2)), on_long)
    got_first.wait()
    need["n"] = max(len(t) for t in times.values()) + AFTER
    reached.clear()
    reached.wait()
    for r in reqs:
        engine.cancel(r.id)
    time.sleep(0.2)  # let the cancellations land before the next round
    return {"ttft_s": long_first[0] - t0, **_gaps(times, t0, long_first[0])}


@as_peer
def run_mlx_lm(model, streams: list[list[int]], long: list[int]) -> dict:
    from mlx_lm.generate import BatchGenerator

    gen = BatchGenerator(model, max_tokens=STREAM_MAX_TOKENS)
    uids = gen.insert(streams, [STREAM_MAX_TOKENS] * STREAMS)
    times: dict[int, list[float]] = {u: [] for u in uids}
    long_uid, t0, first, seen = None, 0.0, None, {}
    while True:
        _, responses = gen.next()
        now = time.perf_counter()
        for r in responses:
            if r.uid in times:
                times[r.uid].append(now)
            elif r.uid == long_uid and first is None:
                first, seen = now, {u: len(t) for u, t in times.items()}
        if long_uid is None and min(len(t) for t in times.values()) >= 3:
            t0 = time.perf_counter()
            long_uid = gen.insert([long], [2])[0]
        if first is not None and all(len(times[u]) >= seen[u] + AFTER for u in times):
            break
    gen.close()
    return {"ttft_s": first - t0, **_gaps(times, t0, first)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--random-model", default=None, help="qwen3-4b: random 4-bit Qwen3-4B shape (GPU)")
    ap.add_argument("--long", type=int, default=2048, help="tokens in the long prompt")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget", type=int, default=None, help="locals' step token budget (default: EngineConfig's)")
    ap.add_argument("--stream-len", type=int, default=32, help="prompt tokens of each decoding stream (served "
                    "agents decode at thousands)")
    args = ap.parse_args()

    from locals.engine.engine import Engine
    from locals.engine.settings import EngineConfig

    ours, theirs, label = load_pair(args.random_model)
    if not args.random_model:
        # Same dense weights for both: this benchmark measures scheduling, not kernels.
        theirs, label = ours.model, "SmolLM2-135M dense f32 (both)"
    ours = no_eos(ours)
    config = EngineConfig(prefix_cache_bytes=0)
    if args.budget:
        config.step_token_budget = args.budget
    engine = Engine(ours, config)
    engine.start()
    streams = prompts(ours.tokenizer, STREAMS, args.stream_len)
    try:
        res = interleaved(args.rounds, {
            # A fresh long prompt each round (no reuse between rounds, whatever the cache).
            "locals": lambda: run_locals(engine, streams, prompts(ours.tokenizer, 1, args.long, seed=time.time_ns())[0]),
            "mlx-lm": lambda: run_mlx_lm(theirs, streams, prompts(ours.tokenizer, 1, args.long, seed=time.time_ns())[0]),
        })
        intervals = engine.stats().extra["step_intervals"]  # the engine's own: decode-only and mixed steps
    finally:
        engine.stop()
    print(f"locals steps: {intervals}")
    table = {name: {k: summary([r[k] for r in runs]) for k in runs[0]} for name, runs in res.items()}
    for name, row in table.items():
        print(f"{name:7s} max gap {row['max_gap_s']['median']:.3f}s (usual {row['usual_gap_s']['median']:.3f}s)"
              f"  long-prompt TTFT {row['ttft_s']['median']:.2f}s")
    path = write_results("long_prompt", {"model": label, "long_tokens": args.long, "streams": STREAMS,
                                         "step_token_budget": config.step_token_budget,
                                         "stream_len": args.stream_len, "step_intervals": intervals,
                                         "compile_max_tokens": config.forward.compile_max_tokens,
                                         "rounds": args.rounds, "results": table, "argv": sys.argv[1:]})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
