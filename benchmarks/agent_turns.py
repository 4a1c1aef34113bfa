"""An agent-like conversation against locals and mlx_lm.server: TTFT per turn, after a restart,
and 8 agents sending the same system prompt at once.

Both servers run the same weights: the embedded SmolLM2 exported as an MLX folder (dense
float32 on CPU, so both use the same OpenBLAS), each as a real server subprocess, driven
over HTTP with streaming chat completions. Servers alternate per round.
    python benchmarks/agent_turns.py --system-tokens 3000 --turns 10 --rounds 1
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
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).parent))
from common import summary, write_results  # noqa: E402


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
    """A locals or mlx_lm server subprocess on a free port."""

    def __init__(self, kind: str, model_dir: Path, home: Path):
        self.kind, self.model_dir, self.home = kind, model_dir, home
        self.port, self.proc = free_port(), None

    def start(self) -> None:
        env = dict(os.environ, LOCALS_HOME=str(self.home), HF_HUB_OFFLINE="1")
        from locals.engine.backend import find_openblas

        blas = find_openblas()
        if blas:
            env["LD_PRELOAD"] = blas
        if self.kind == "locals":
            cmd = [sys.executable, "-m", "locals", "serve", "--model", "smollm2", "--port", str(self.port)]
        else:
            cmd = [sys.executable, "-m", "mlx_lm", "server", "--model", str(self.model_dir),
                   "--port", str(self.port)]
        log = open(self.home / f"{self.kind}.log", "ab")
        self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    pass
                import urllib.request

                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/models", timeout=5).read()
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
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/chat/completions"


async def ttft(session, url: str, messages: list[dict], max_tokens: int) -> tuple[float, str]:
    """Seconds to the first streamed content token, and the full reply text."""
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    start, first, text = time.perf_counter(), None, ""
    async with session.post(url, json=body) as resp:
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
            t, reply = await ttft(session, server.url, messages, max_tokens)
            messages.append({"role": "assistant", "content": reply})
            out.append(t)
    return out


async def agents_at_once(server: Server, system: str, users: list[str], max_tokens: int) -> float:
    """Time until the last of len(users) simultaneous agents sees its first token."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:
        times = await asyncio.gather(*[
            ttft(session, server.url, [{"role": "system", "content": system}, {"role": "user", "content": u}],
                 max_tokens) for u in users])
    return max(t for t, _ in times)


def run_one(kind: str, model_dir: Path, system: str, users: list[str], agents: list[str],
            max_tokens: int) -> dict:
    home = Path(tempfile.mkdtemp(prefix=f"bench-{kind}-"))
    server = Server(kind, model_dir, home)
    server.start()
    try:
        turns = asyncio.run(conversation(server, system, users, max_tokens))
    finally:
        server.stop()
    server.start()  # a restart: same home dir, so locals finds its disk cache
    try:
        after_restart = asyncio.run(conversation(server, system, users[:1], max_tokens))[0]
    finally:
        server.stop()
    server.start()  # fresh process, then 8 agents at once with one system prompt
    try:
        warm = asyncio.run(conversation(server, "You are a helpful assistant.", ["hi"], 4))
        last = asyncio.run(agents_at_once(server, system + "\n(agents)", agents, max_tokens))
    finally:
        server.stop()
    return {"turn_ttft_s": turns, "after_restart_ttft_s": after_restart, "agents_last_ttft_s": last,
            "warmup_s": warm}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system-tokens", type=int, default=3000)
    parser.add_argument("--turn-tokens", type=int, default=200)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--peers", default="locals,mlx_lm")
    args = parser.parse_args()

    import argparse as m1
    import collections as m2
    import json.decoder as m3
    import textwrap as m4

    from locals.engine.export import export_mlx
    from locals.engine.models import load_model

    tokenizer = load_model("smollm2").tokenizer
    system = "You are a coding agent. Here is the project you work on:\n" + text_of_tokens(
        tokenizer, args.system_tokens, [m1, m2])
    chunks = text_of_tokens(tokenizer, args.turn_tokens * (args.turns + args.agents), [m3, m4, m2])
    ids = tokenizer.encode(chunks, add_special_tokens=False)
    pieces = [tokenizer.decode(ids[i * args.turn_tokens:(i + 1) * args.turn_tokens])
              for i in range(args.turns + args.agents)]
    users = [f"Turn {i}: explain this code.\n{p}" for i, p in enumerate(pieces[:args.turns])]
    agents = [f"Agent {i}: summarize.\n{p}" for i, p in enumerate(pieces[args.turns:])]
    model_dir = export_mlx("smollm2", Path(tempfile.mkdtemp(prefix="smollm2-mlx-")), dense=True)

    results: dict[str, list[dict]] = {p: [] for p in args.peers.split(",")}
    for r in range(args.rounds):
        order = list(results) if r % 2 == 0 else list(reversed(results))
        for kind in order:
            res = run_one(kind, model_dir, system, users, agents, args.max_tokens)
            results[kind].append(res)
            print(kind, json.dumps(res), flush=True)
    table = {}
    for kind, runs in results.items():
        cold = summary([r["turn_ttft_s"][0] for r in runs])["median"]
        table[kind] = {
            "cold_ttft_s": summary([r["turn_ttft_s"][0] for r in runs]),
            "later_turns_ttft_s": summary([t for r in runs for t in r["turn_ttft_s"][1:]]),
            "after_restart_ttft_s": summary([r["after_restart_ttft_s"] for r in runs]),
            "agents_last_ttft_s": summary([r["agents_last_ttft_s"] for r in runs]),
            "later_turn_vs_cold": summary([t for r in runs for t in r["turn_ttft_s"][1:]])["median"] / cold,
            "after_restart_vs_cold": summary([r["after_restart_ttft_s"] for r in runs])["median"] / cold,
            "agents_last_vs_cold": summary([r["agents_last_ttft_s"] for r in runs])["median"] / cold,
        }
    path = write_results("agent_turns", {"args": vars(args), "runs": results, "table": table})
    print(json.dumps(table, indent=1))
    print("wrote", path)


if __name__ == "__main__":
    main()
