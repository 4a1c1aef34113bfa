"""Measuring decode speed: locals' engine and mlx-lm's BatchGenerator on the same weights and
prompts, variants interleaved in rounds, every sample kept. Used by `locals bench --engine` (a
diagnostic: what the engine can do in-process, not what a client gets over HTTP) and the
scripts in benchmarks/.

Each request decodes exactly `max_tokens` tokens (EOS ignored on both sides). Decode tok/s
is all rows' tokens after their first over the time from the last first token to the end,
so reading prompts does not count; TTFT is the median over rows from submit to first token.
Rows whose prompts differ in length start and end decoding apart, so the batch is not whole
for all of that time: `all_rows_tps` counts only the time while every row was decoding.
"""

from __future__ import annotations

import copy
import dataclasses
import random
import threading
import time

import psutil


def timing(submitted: float, firsts: list[float], ends: list[float], n_tokens: int, batch: int,
           stamps: list[list[tuple[float, int]]] | None = None) -> dict:
    """Decode tok/s, median TTFT and wall time of one batch (see the module docstring); with
    `stamps` (each row's (time, tokens) arrivals) also `all_rows_tps`."""
    start, end = max(firsts), max(ends)
    decode = batch * (n_tokens - 1) / max(end - start, 1e-9)
    ttft = sorted(f - submitted for f in firsts)
    out = {"decode_tps": decode, "ttft_s": ttft[len(ttft) // 2], "wall_s": end - submitted}
    if stamps is not None:
        out["all_rows_tps"] = all_rows_rate(stamps)
    return out


def all_rows_rate(stamps: list[list[tuple[float, int]]]) -> float | None:
    """Tokens that arrived while every row was decoding (after the last row's first token, up
    to the first row's last) over that time; None when the rows never all decoded at once."""
    start = max(row[0][0] for row in stamps)
    end = min(row[-1][0] for row in stamps)
    if end <= start:
        return None
    return sum(n for row in stamps for at, n in row if start < at <= end) / (end - start)


def without_eos(loaded):
    """A copy of `loaded` whose tokenizer never stops on EOS, so every run decodes max_tokens."""
    tok = copy.copy(loaded.tokenizer)
    tok._eos_token_ids = set()
    return dataclasses.replace(loaded, tokenizer=tok)


def bench_prompts(tokenizer, n: int, length: int, seed: int = 0) -> list[list[int]]:
    """`n` distinct prompts of exactly `length` tokens (chat-style requests, padded with text)."""
    rng = random.Random(seed)
    topics = ["the sea", "a city at night", "compilers", "bread", "a lighthouse", "winter", "trains",
              "a garden", "the moon", "old computers", "rivers", "chess", "a library", "storms"]
    filler = tokenizer.encode(" Tell it slowly, with many details.", add_special_tokens=False)
    out = []
    for i in range(n):
        text = f"Write a long story about {rng.choice(topics)} and {rng.choice(topics)} (#{i})."
        ids = tokenizer.encode(text, add_special_tokens=False)
        while len(ids) < length:
            ids += filler
        out.append(ids[:length])
    return out


def run_locals(engine, prompts: list[list[int]], max_tokens: int) -> dict:
    """One batch through a started locals Engine (its tokenizer must ignore EOS)."""
    from locals.protocol import FinishEvent, GenerationRequest, SamplingParams, TokenEvent

    done = threading.Event()
    firsts, ends, counts = {}, {}, {}
    stamps = [[] for _ in prompts]
    lock = threading.Lock()

    def sink_for(i):
        def sink(ev):
            now = time.perf_counter()
            if isinstance(ev, TokenEvent) and ev.tokens:
                firsts.setdefault(i, now)
                counts[i] = counts.get(i, 0) + len(ev.tokens)
                stamps[i].append((now, len(ev.tokens)))
            elif isinstance(ev, FinishEvent):
                ends[i] = now
                with lock:
                    if len(ends) == len(prompts):
                        done.set()
        return sink

    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        engine.submit(GenerationRequest(p, SamplingParams(max_tokens=max_tokens)), sink_for(i))
    done.wait()
    if any(c != max_tokens for c in counts.values()):
        raise RuntimeError(f"a request stopped early: {counts} tokens, expected {max_tokens} each")
    return timing(t0, list(firsts.values()), list(ends.values()), max_tokens, len(prompts), stamps)


def run_mlx_lm(model, prompts: list[list[int]], max_tokens: int) -> dict:
    """One batch through mlx-lm's BatchGenerator on `model`'s weights, with MLX's own ops even
    where an engine swapped tuned kernels into it (on its twin: kernels/twin.py)."""
    from mlx_lm.generate import BatchGenerator

    from locals.engine.kernels import mlx_ops_twin

    gen = BatchGenerator(mlx_ops_twin(model), max_tokens=max_tokens, completion_batch_size=max(32, len(prompts)))
    t0 = time.perf_counter()
    gen.insert(prompts, [max_tokens] * len(prompts))
    firsts, ends, counts, stamps = {}, {}, {}, {}
    while len(ends) < len(prompts):
        for r in gen.next_generated():
            now = time.perf_counter()
            firsts.setdefault(r.uid, now)
            counts[r.uid] = counts.get(r.uid, 0) + 1
            stamps.setdefault(r.uid, []).append((now, 1))
            if r.finish_reason is not None:
                ends[r.uid] = now
    gen.close()
    if any(c != max_tokens for c in counts.values()):
        raise RuntimeError(f"mlx-lm stopped early: {counts} tokens, expected {max_tokens} each")
    return timing(t0, list(firsts.values()), list(ends.values()), max_tokens, len(prompts),
                  list(stamps.values()))


def machine_info() -> dict:
    """What a benchmark report needs to be compared with another: chip, memory, versions."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    import mlx.core as mx

    def ver(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return ""

    try:
        device = dict(mx.device_info())
    except Exception:  # the CPU backend has no device info on some MLX versions
        device = {}
    return {"platform": platform.platform(), "machine": platform.machine(), "python": platform.python_version(),
            "device": str(mx.default_device()), "device_info": {k: str(v) for k, v in device.items()},
            "memory_bytes": psutil.virtual_memory().total, "cpu_count": psutil.cpu_count(),
            "mlx": mx.__version__, "mlx_lm": ver("mlx-lm"), "locals": ver("locals")}
