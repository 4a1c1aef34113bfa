"""Where a fresh `locals serve` spends its first requests' time (a diagnostic, not a headline:
serve_traffic.py compares servers). Starts the server on a random Qwen3-shaped 4-bit model once
per variant (`--variant NAME:KEY=VALUE,...` adds environment variables), then sends, streaming:
one agent-sized request (a 2–4k-token prompt), eight at once at other lengths, and the same
eight again with one more turn each. Reports each request's TTFT and wall time, and the server's
own account: the slow steps and compiles it logged, and its stats.

    python benchmarks/first_requests.py                                  # H200, ~1.5 min a variant
    python benchmarks/first_requests.py --variant plain --variant nocudnn:MLX_CUDA_USE_CUDNN_SDPA=0
    python benchmarks/first_requests.py --shape qwen3-tiny               # tries it on a CPU

Each variant gets its own MLX kernel folder (MLX_PTX_CACHE_DIR), empty at its start: a fresh
machine. Results: benchmarks/results/first_requests-<device>-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp  # noqa: E402

from benchmarks.common import QWEN3_SHAPES, RESULTS  # noqa: E402
from benchmarks.random_folder import write_random_qwen3  # noqa: E402
from locals.traffic import servers as srv  # noqa: E402
from locals.traffic.driver import Reply, stream_chat  # noqa: E402
from locals.traffic.workload import words  # noqa: E402

SERVER_LINES = ("slow step", "compiled", "untuned", "ready", "serving")


def _variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, pairs = text.partition(":")
    return name, dict(p.split("=", 1) for p in pairs.split(",") if p)


async def _send(url: str, zero: float, prompts: list[str], tokens: int, label: str) -> list[dict]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        bodies = [{"messages": [{"role": "user", "content": p}], "max_tokens": tokens, "temperature": 0.7,
                   "stream": True, "stream_options": {"include_usage": True}} for p in prompts]
        replies = await asyncio.gather(*(stream_chat(session, url, b, Reply(i, 0, time.perf_counter() - zero), zero)
                                         for i, b in enumerate(bodies)))
    out = [{"wave": label, "prompt_tokens": r.prompt_tokens, "tokens": r.completion_tokens,
            "ttft_s": round(r.ttft, 2) if r.ttft is not None else None, "wall_s": round(r.wall, 2),
            "error": r.error} for r in replies]
    for row in out:
        print(f"  {label:7s} prompt {row['prompt_tokens']} → {row['tokens']} tokens: TTFT {row['ttft_s']} s, "
              f"wall {row['wall_s']} s{'  ' + row['error'] if row['error'] else ''}", flush=True)
    return out


def one_variant(folder: Path, name: str, env: dict[str, str], scratch: Path, tokens: int) -> dict:
    env = {"MLX_PTX_CACHE_DIR": str(scratch / f"kernels-{name}"), "LOCALS_HOME": str(scratch / f"home-{name}"), **env}
    spec = srv.ServerSpec(name, (sys.executable, "-m", "locals", "serve", "--model", str(folder), "--port", "{port}"),
                          "/health", env)
    log_path = scratch / f"{name}.log"
    running = srv.start(spec, log_path, 600)
    print(f"{name}: ready in {running.ready_s:.1f} s", flush=True)
    rng = random.Random(0)
    base = [words(rng, rng.randint(1000, 3000)) for _ in range(8)]
    record = {"variant": name, "env": env, "ready_s": round(running.ready_s, 1), "requests": []}
    try:
        waves = [("first", [words(rng, rng.randint(2000, 4000))]), ("eight", base),
                 ("again", [b + " " + words(rng, rng.randint(100, 1500)) for b in base])]
        for label, prompts in waves:
            record["requests"] += asyncio.run(_send(running.url, running.zero, prompts, tokens, label))
        with urllib.request.urlopen(running.url + "/v1/locals/status", timeout=10) as resp:
            status = json.loads(resp.read())
        extra = (status.get("engine") or {}).get("extra") or {}
        record["stats"] = {k: extra.get(k) for k in ("slow_steps", "slowest_step_s", "compiled_shapes",
                                                      "compile_seconds", "uncompiled_passes", "compiling_ahead")}
        print(f"  server: {record['stats']}", flush=True)
    finally:
        srv.stop(running)
    record["server_lines"] = [line for line in log_path.read_text(errors="replace").splitlines()
                              if any(key in line for key in SERVER_LINES)][:200]
    print("\n".join(record["server_lines"][-40:]), flush=True)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="qwen3-4b", choices=sorted(QWEN3_SHAPES))
    parser.add_argument("--variant", action="append", default=None, help="NAME or NAME:KEY=VALUE,... (repeatable)")
    parser.add_argument("--tokens", type=int, default=64, help="reply tokens per request")
    args = parser.parse_args()
    import mlx.core as mx

    device = "gpu" if mx.default_device() == mx.gpu else "cpu"
    path = RESULTS / f"first_requests-{device}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    report = {"benchmark": "first_requests", "shape": args.shape, "tokens": args.tokens, "variants": []}
    with tempfile.TemporaryDirectory(prefix="first-requests-") as scratch:
        folder = write_random_qwen3(Path(scratch) / args.shape, args.shape)
        for text in args.variant or ["plain"]:
            name, env = _variant(text)
            report["variants"].append(one_variant(folder, name, env, Path(scratch), args.tokens))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(report, indent=1))
    print(f"report: {path}")


if __name__ == "__main__":
    main()
