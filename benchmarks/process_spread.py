"""Decode tok/s across fresh processes: the spread that one long-lived process cannot show.

Each child process builds the engine, warms up, and times each batch size `--rounds` times;
the parent runs `--processes` children one after another and keeps every sample. With
`--homes A,B` the children alternate between LOCALS_HOME folders (e.g. two tuning tables),
and with `--envs` between environment settings (every home with every setting), so
settings are compared process against process, interleaved. On the H200 a B = 8 step
was ~5 ms in some processes and ~7 ms in others, steady within each (docs/benchmarks-log.md).

    python benchmarks/process_spread.py --random-model qwen3-4b --batches 8 --processes 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import summary, write_results  # noqa: E402

MARK = "process_spread: "  # the child's result line


def child(args) -> None:
    """One process: the engine at each batch size, `rounds` timed runs after a warm-up."""
    from benchmarks.common import prompts
    from benchmarks.step_kernels import engine_for
    from locals.engine.bench import run_locals

    engine, _label = engine_for(args.random_model)
    engine.start()
    try:
        samples = {}
        for batch in _batches(args):
            ps = prompts(engine.loaded.tokenizer, batch, args.prompt_len, seed=batch)
            run_locals(engine, ps, 8)
            samples[batch] = [run_locals(engine, ps, args.tokens)["decode_tps"] for _ in range(args.rounds)]
    finally:
        engine.stop()
    print(MARK + json.dumps(samples), flush=True)


def _batches(args) -> list[int]:
    return [int(b) for b in args.batches.split(",")]


def run_child(args, home: str | None, extra: str = "") -> dict[int, list[float]]:
    """Run one child (under LOCALS_HOME=`home` when given, with the NAME=VALUE words of `extra`
    in its environment) and return its samples per batch."""
    env = dict(os.environ, **({"LOCALS_HOME": home} if home else {}),
               **dict(word.split("=", 1) for word in extra.split()))
    cmd = [sys.executable, __file__, "--child", "--random-model", args.random_model, "--batches", args.batches,
           "--rounds", str(args.rounds), "--tokens", str(args.tokens), "--prompt-len", str(args.prompt_len)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith(MARK)), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"a child failed ({done.returncode}):\n{(done.stdout + done.stderr)[-2000:]}")
    return {int(b): v for b, v in json.loads(line[len(MARK):]).items()}


def settings(homes: str, envs: str) -> list[tuple[str | None, str, str]]:
    """(LOCALS_HOME or None, NAME=VALUE words, a name) for every home with every environment setting."""
    home_list = [h for h in homes.split(",") if h] or [None]
    extras = [e.strip() for e in envs.split(";") if e.strip()] or [""]
    return [(home, extra, " ".join(filter(None, [home or ("" if extra else "default"), extra])))
            for home in home_list for extra in extras]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--random-model", default="qwen3-4b", help="qwen3-4b (GPU) or qwen3-tiny (tries it on a CPU)")
    ap.add_argument("--batches", default="8")
    ap.add_argument("--processes", type=int, default=4, help="children per setting")
    ap.add_argument("--rounds", type=int, default=3, help="timed runs per batch size in each child")
    ap.add_argument("--tokens", type=int, default=32, help="tokens decoded per request")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--homes", default="", help="comma-separated LOCALS_HOME folders to alternate (default: as set)")
    ap.add_argument("--envs", default="", help="';'-separated environment settings to alternate, each a list of "
                    "NAME=VALUE words, e.g. 'MLX_MAX_OPS_PER_BUFFER=20;MLX_MAX_OPS_PER_BUFFER=100'")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per child")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)

    plan = settings(args.homes, args.envs)
    runs: dict[str, list[dict]] = {name: [] for _h, _e, name in plan}
    path = None
    for i in range(args.processes):
        for home, extra, name in plan:
            samples = run_child(args, home, extra)
            runs[name].append({str(b): v for b, v in samples.items()})
            print(f"process {i + 1} ({name}): "
                  + ", ".join(f"B={b} {statistics.median(v):.0f} tok/s" for b, v in samples.items()), flush=True)
            rows = [{"setting": name, "batch": b,
                     "process_medians": [statistics.median(r[str(b)]) for r in procs],
                     "across_processes": summary([statistics.median(r[str(b)]) for r in procs]),
                     "samples": [r[str(b)] for r in procs]}
                    for name, procs in runs.items() if procs for b in _batches(args)]
            path = write_results("process_spread", {"model": args.random_model, "tokens": args.tokens,
                                                    "prompt_len": args.prompt_len, "rows": rows}, path)
    print(f"results: {path}")


if __name__ == "__main__":
    main()
