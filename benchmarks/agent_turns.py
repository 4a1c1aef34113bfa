"""An agent-like conversation against locals and mlx_lm.server: TTFT per turn, after a restart,
and 8 agents sending the same system prompt at once.

Both servers run the same weights, each as a real server subprocess, driven over HTTP with
streaming chat completions; servers alternate per round. On a CPU: the embedded SmolLM2
(locals reads its GGUF as dense float32; mlx_lm.server the same weights exported as an MLX
folder), both with the same OpenBLAS. On a GPU: `--random-model qwen3-4b` writes a
Qwen3-4B-shaped random 4-bit MLX folder (byte-level tokenizer, ChatML) that both load.
    python benchmarks/agent_turns.py --system-tokens 3000 --turns 10 --rounds 1
    python benchmarks/agent_turns.py --random-model qwen3-4b --system-tokens 16000
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).parent))
from common import QWEN3_SHAPES, byte_tokenizer, summary, write_results  # noqa: E402

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def text_of_tokens(tokenizer, n_tokens: int, seed_modules) -> str:
    """Real source text cut to about n_tokens tokens (deterministic)."""
    text = "".join(inspect.getsource(m) for m in seed_modules)
    ids = tokenizer.encode(text, add_special_tokens=False)[:n_tokens]
    return tokenizer.decode(ids)


class Server:
    """A locals or mlx_lm server subprocess on a free port, serving `model` (a name or folder)."""

    def __init__(self, kind: str, model: str, home: Path):
        self.kind, self.model, self.home = kind, model, home
        self.port, self.proc = free_port(), None
        # mlx_lm.server serves its --model under this name; locals serves whatever it loaded.
        self.model_name = "default_model" if kind == "mlx_lm" else "m"

    def start(self) -> None:
        # HF_HUB_CACHE must exist: mlx_lm.server scans it to answer /v1/models.
        hub = self.home / "hf-hub"
        hub.mkdir(exist_ok=True)
        env = dict(os.environ, LOCALS_HOME=str(self.home), HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(hub))
        from locals.engine.load.backend import find_openblas

        blas = find_openblas()
        if blas:
            env["LD_PRELOAD"] = blas
        if self.kind == "locals":
            cmd = [sys.executable, "-m", "locals", "serve", "--model", self.model, "--port", str(self.port)]
        else:
            cmd = [sys.executable, "-m", "mlx_lm", "server", "--model", self.model, "--port", str(self.port)]
        log = open(self.home / f"{self.kind}.log", "ab")
        self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        ready = "/health" if self.kind == "mlx_lm" else "/v1/models"
        deadline = time.time() + 600
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}{ready}", timeout=5).read()
                return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.kind} server exited; see {self.home}/{self.kind}.log")
                time.sleep(0.5)
        raise RuntimeError(f"{self.kind} server did not start")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(70)  # the server finishes prompt-cache disk writes (up to 60 s)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def engine_stats(self) -> dict | None:
        """locals' engine counters after a phase (cache hits, shared-prefill waits); None for peers."""
        if self.kind != "locals":
            return None
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/locals/status", timeout=10) as r:
            engine = json.loads(r.read()).get("engine") or {}
        keys = ("prompt_tokens_total", "cached_tokens_total", "steps", "extra")
        return {k: engine.get(k) for k in keys}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/chat/completions"


async def ttft(session, server: Server, messages: list[dict], max_tokens: int) -> tuple[float, str]:
    """Seconds to the first streamed content token, and the full reply text."""
    body = {"model": server.model_name, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True}
    start, first, text = time.perf_counter(), None, ""
    async with session.post(server.url, json=body) as resp:
        resp.raise_for_status()
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            delta = json.loads(line[5:])["choices"][0].get("delta", {}).get("content") or ""
            if delta and first is None:
                first = time.perf_counter() - start
            text += delta
    return (first if first is not None else time.perf_counter() - start), text


async def conversation(server: Server, system: str, users: list[str], max_tokens: int) -> list[float]:
    messages, out = [{"role": "system", "content": system}], []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:
        for user in users:
            messages.append({"role": "user", "content": user})
            t, reply = await ttft(session, server, messages, max_tokens)
            messages.append({"role": "assistant", "content": reply})
            out.append(t)
    return out


async def agents_at_once(server: Server, system: str, users: list[str], max_tokens: int) -> float:
    """Time until the last of len(users) simultaneous agents sees its first token."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:
        times = await asyncio.gather(*[
            ttft(session, server, [{"role": "system", "content": system}, {"role": "user", "content": u}],
                 max_tokens) for u in users])
    return max(t for t, _ in times)


def run_one(kind: str, model: str, texts: dict, max_tokens: int) -> dict:
    """One server's three phases, each in a fresh process that first reads an unrelated
    prompt (so first-use costs such as GPU kernel compilation do not count as a cold read)."""
    home = Path(tempfile.mkdtemp(prefix=f"bench-{kind}-"))
    server = Server(kind, model, home)
    system, users, agents = texts["system"], texts["users"], texts["agents"]
    warm = []

    stats = []

    def phase(run):
        server.start()
        try:
            warm.append(asyncio.run(conversation(server, texts["warmup"], ["hi"], 4))[0])
            result = asyncio.run(run)
            stats.append(server.engine_stats())
            return result
        finally:
            server.stop()

    turns = phase(conversation(server, system, users, max_tokens))
    # A restart: same home dir, so locals finds its disk cache.
    after_restart = phase(conversation(server, system, users[:1], max_tokens))[0]
    # The agents at once, with a system prompt no earlier request used.
    last = phase(agents_at_once(server, "(agents)\n" + system, agents, max_tokens))
    return {"turn_ttft_s": turns, "after_restart_ttft_s": after_restart, "agents_last_ttft_s": last,
            "warmup_s": warm, "engine_stats": stats}


def random_model_folder(shape: str, out: Path) -> Path:
    """A Qwen3-shaped MLX folder with random 4-bit weights and a byte-level ChatML tokenizer."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen3

    dims = dict(QWEN3_SHAPES[shape], vocab_size=256)  # the byte tokenizer's vocabulary
    config = dict(model_type="qwen3", rms_norm_eps=1e-6, max_position_embeddings=40960,
                  rope_theta=1_000_000.0, tie_word_embeddings=True, **dims)
    mx.random.seed(0)
    model = qwen3.Model(qwen3.ModelArgs(**config))
    model.set_dtype(mx.bfloat16)
    nn.quantize(model, group_size=64, bits=4)
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())),
                        metadata={"format": "mlx"})
    config.update(quantization={"group_size": 64, "bits": 4}, torch_dtype="bfloat16", eos_token_id=[])
    (out / "config.json").write_text(json.dumps(config, indent=2))
    hf = byte_tokenizer()._tokenizer
    hf.chat_template = CHATML
    hf.save_pretrained(str(out))
    return out


def prepare_models(random_model: str | None) -> tuple[object, dict[str, str]]:
    """(tokenizer to size the prompts with, the model each server kind loads)."""
    work = Path(tempfile.mkdtemp(prefix="agent-turns-model-"))
    if random_model:
        if random_model not in QWEN3_SHAPES:
            raise SystemExit(f"unknown --random-model {random_model!r}; known: {', '.join(QWEN3_SHAPES)}")
        folder = str(random_model_folder(random_model, work))
        return byte_tokenizer(), {"locals": folder, "mlx_lm": folder}
    from locals.engine.load.export import export_mlx
    from locals.engine.load.models import load_model

    folder = str(export_mlx("smollm2", work, dense=True))
    return load_model("smollm2").tokenizer, {"locals": "smollm2", "mlx_lm": folder}


def build_texts(tokenizer, args) -> dict:
    """The system prompt, one user message per turn, one first message per agent, and an
    unrelated prompt a quarter as long to warm each fresh server with."""
    import argparse as m1
    import collections as m2
    import json.decoder as m3
    import textwrap as m4

    system = "You are a coding agent. Here is the project you work on:\n" + text_of_tokens(
        tokenizer, args.system_tokens, [m1, m2, m3, m4])
    chunks = text_of_tokens(tokenizer, args.turn_tokens * (args.turns + args.agents), [m3, m4, m2, m1])
    ids = tokenizer.encode(chunks, add_special_tokens=False)
    pieces = [tokenizer.decode(ids[i * args.turn_tokens:(i + 1) * args.turn_tokens])
              for i in range(args.turns + args.agents)]
    users = [f"Turn {i}: explain this code.\n{p}" for i, p in enumerate(pieces[:args.turns])]
    agents = [f"Agent {i}: summarize.\n{p}" for i, p in enumerate(pieces[args.turns:])]
    warmup = "Summarize this file.\n" + text_of_tokens(tokenizer, args.system_tokens // 4, [m4, m3])
    return {"system": system, "users": users, "agents": agents, "warmup": warmup}


def table_of(results: dict[str, list[dict]]) -> dict:
    table = {}
    for kind, runs in results.items():
        cold = summary([r["turn_ttft_s"][0] for r in runs])
        later = summary([t for r in runs for t in r["turn_ttft_s"][1:]])
        restart = summary([r["after_restart_ttft_s"] for r in runs])
        agents = summary([r["agents_last_ttft_s"] for r in runs])
        table[kind] = {
            "cold_ttft_s": cold, "later_turns_ttft_s": later, "after_restart_ttft_s": restart,
            "agents_last_ttft_s": agents,
            "later_turn_vs_cold": later["median"] / cold["median"],
            "after_restart_vs_cold": restart["median"] / cold["median"],
            "agents_last_vs_cold": agents["median"] / cold["median"],
        }
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system-tokens", type=int, default=3000)
    parser.add_argument("--turn-tokens", type=int, default=200)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--peers", default="locals,mlx_lm")
    parser.add_argument("--random-model", default=None,
                        help=f"random-weight 4-bit model shape for GPUs ({', '.join(QWEN3_SHAPES)})")
    args = parser.parse_args()

    tokenizer, models = prepare_models(args.random_model)
    texts = build_texts(tokenizer, args)
    results: dict[str, list[dict]] = {p: [] for p in args.peers.split(",")}
    for r in range(args.rounds):
        order = list(results) if r % 2 == 0 else list(reversed(results))
        for kind in order:
            res = run_one(kind, models[kind], texts, args.max_tokens)
            results[kind].append(res)
            print(kind, json.dumps(res), flush=True)
    table = table_of(results)
    path = write_results("agent_turns", {"args": vars(args), "runs": results, "table": table})
    print(json.dumps(table, indent=1))
    print("wrote", path)


if __name__ == "__main__":
    main()
