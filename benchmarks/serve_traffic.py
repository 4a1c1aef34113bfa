"""Served traffic on a GPU: `locals serve` against `mlx_lm.server`, fresh subprocesses on the
same random-weight Qwen3-4B-shaped 4-bit model (full 151,936-token vocabulary, a ChatML
tokenizer covering it), driven over HTTP by agent-shaped traffic — what `locals bench` runs,
on a model written for the occasion (benchmarks/random_folder.py).

    python benchmarks/serve_traffic.py --agents 8 --rounds 1 --kernels K  # H200, fresh: ~7 min
    python benchmarks/serve_traffic.py --agents 8 --kernels K   # then 3 rounds on the kept kernels
    python benchmarks/serve_traffic.py --shape qwen3-tiny --quick   # tries the script on a CPU
    python benchmarks/serve_traffic.py --merge A.json B.json   # rounds run as commands in a row, one report
    python benchmarks/serve_traffic.py --servers locals --variant graphs400:MLX_CUDA_GRAPH_CACHE_SIZE=400 \
        --agents 8 --kernels K   # locals against itself with a setting changed, interleaved
    python benchmarks/serve_traffic.py --peer-args 'mlx_lm.server=--prompt-concurrency 2' --agents 16 --kernels K

On a fresh GPU each server's first round is mostly MLX compiling its CUDA kernels (minutes), so
a cold round and warm rounds rarely fit one 10-minute device command: `--kernels` keeps each
server's kernel folder between runs (the report counts the files each held at its start).

Scaling (stated in the report's workload): full prompt and reply sizes (2–4k-token system
prompt, 100–1,500 tokens a turn, replies of 50–400, bursts of 256), 2 turns an agent before
the burst, tool time and staggered starts x 0.1 (0–1 s of tool time, starts over 1 s).
--quick: 1 turn, sizes x 0.5. Results: benchmarks/results/serve_traffic-<device>-<time>.json,
saved after each server's round; server logs in the folder beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import QWEN3_SHAPES, RESULTS  # noqa: E402
from benchmarks.random_folder import write_random_qwen3  # noqa: E402
from locals.cli.bench_traffic import (parse_agents, parse_peer_args, parse_servers, parse_variants,  # noqa: E402
                                      traffic_bench)
from locals.errors import LocalsError  # noqa: E402
from locals.measure import other_cpu_percent  # noqa: E402
from locals.traffic.workload import Workload  # noqa: E402

QUICK = {"agents": "1,8", "rounds": 2, "turns": 1, "size_scale": 0.5}


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", default="1,8,16", help="agent counts, one phase each (default 1,8,16)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turns", type=int, default=2, help="turns per agent before the burst")
    parser.add_argument("--time-scale", type=float, default=0.1, help="multiplies tool time and staggered starts")
    parser.add_argument("--size-scale", type=float, default=1.0, help="multiplies prompt and reply lengths")
    parser.add_argument("--shape", default="qwen3-4b", choices=sorted(QWEN3_SHAPES))
    parser.add_argument("--servers", default="locals,mlx_lm.server")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-minutes", type=float, default=8.5,
                        help="start no server round that would likely end after this, judged by that server's "
                             "earlier rounds; a server's first round starts while time is left (default 8.5: a "
                             "device command stops at 10 minutes, and the model is written first)")
    parser.add_argument("--quick", action="store_true", help="1/8 agents, 2 rounds, 1 turn, sizes x 0.5")
    parser.add_argument("--kernels", type=Path, default=None,
                        help="GPU: keep each server's CUDA kernel folder under this folder; a later run given "
                             "the same folder starts warm, as a machine does after its first start (default: "
                             "empty folders, a fresh machine)")
    parser.add_argument("--variant", action="append", default=None, metavar="NAME:VAR=VALUE[,VAR=VALUE]",
                        help="also run locals with these environment settings, named `locals NAME`, in the same "
                             "interleaved rounds (an A/B of a setting; repeatable)")
    parser.add_argument("--peer-args", action="append", default=None, metavar="SERVER=ARGS",
                        help="start that peer with these arguments added, e.g. 'mlx_lm.server=--prompt-concurrency "
                             "2' (a peer tuned as a user would; the report's weights say so; repeatable)")
    parser.add_argument("--out", type=Path, default=None, help="report file or folder (default benchmarks/results/)")
    parser.add_argument("--merge", type=Path, nargs="+", default=None, metavar="REPORT",
                        help="write one report of these reports' rounds (commands run in a row on one machine, "
                             "each within the device's 10 minutes) and print its table; runs nothing")
    args = parser.parse_args()
    if args.quick:
        for key, value in QUICK.items():
            if getattr(args, key) == parser.get_default(key):
                setattr(args, key, value)
    return args


def _report_path(out: Path | None) -> Path:
    import mlx.core as mx

    device = "gpu" if mx.default_device() == mx.gpu else "cpu"
    name = f"serve_traffic-{device}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    if out is None:
        path = RESULTS / name
    else:
        path = out / name if out.is_dir() or not out.suffix else out
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def merge_reports(paths: list[Path], out: Path | None) -> None:
    from locals.cli.common import console
    from locals.traffic.report import table
    from locals.traffic.run import merge, save

    reports = [json.loads(p.read_text()) for p in paths]
    merged = merge(reports, [p.name for p in paths])
    device = "gpu" if merged.get("backend") == "cuda" else "cpu"
    name = f"serve_traffic-{device}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path = save(merged, (out or RESULTS) / name if out is None or out.is_dir() or not out.suffix else out)
    console.print(table(merged))
    print(f"report: {path}")


def main() -> None:
    args = _args()
    if args.merge:
        merge_reports(args.merge, args.out)
        return
    plan_args = {"agents": parse_agents(args.agents), "rounds": args.rounds, "seed": args.seed,
                 "workload": Workload(turns=args.turns, size_scale=args.size_scale, time_scale=args.time_scale),
                 "time_limit_s": args.max_minutes * 60 if args.max_minutes else None,
                 # A device command stops at 10 minutes: a stuck server must not take them all.
                 "ready_timeout_s": 300.0, "request_timeout_s": 180.0}
    # Bad input fails before the model is written.
    servers, variants = parse_servers(args.servers), parse_variants(args.variant)
    peer_args = parse_peer_args(args.peer_args, servers)
    path = _report_path(args.out)
    busy = other_cpu_percent()
    print(f"workload: {plan_args['workload'].scaled()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="serve-traffic-") as scratch:
        t0 = time.perf_counter()
        folder = write_random_qwen3(Path(scratch) / args.shape, args.shape, seed=args.seed)
        print(f"random {args.shape} 4-bit written in {time.perf_counter() - t0:.0f} s", flush=True)
        traffic_bench(str(folder), plan_args, servers, path, busy, args.kernels, variants, peer_args)
    print(f"total {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    try:
        main()
    except LocalsError as exc:  # bad input: one line that says how to fix it
        raise SystemExit(f"error: {exc}") from None
