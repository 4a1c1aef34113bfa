"""Aggregate decode tok/s and time to first token at several batch sizes:
locals' engine against mlx-lm's BatchGenerator, same prompts, interleaved rounds.

    python benchmarks/batch_decode.py                      # CPU, embedded SmolLM2
    python benchmarks/batch_decode.py --random-model qwen3-4b --batches 1,2,4,8,16,32   # GPU
    python benchmarks/batch_decode.py --random-model qwen3-4b --batches 8,32 --length-spread 192   # rows of different lengths
    python benchmarks/batch_decode.py --random-model qwen3-4b --unfused-baseline   # what joined q/k/v, gate/up add
    python benchmarks/batch_decode.py --random-model qwen3-4b --ungated-baseline   # SwiGLU in gate/up's kernel or not
    python benchmarks/batch_decode.py --random-model qwen3-4b --seams-baseline   # one compiled graph a step or not
    python benchmarks/batch_decode.py --random-model qwen3-4b --length-spread 448 \
        --mlx-attention-baseline   # the decode attention kernel against MLX's attention, rows at 64..512
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (bench_engine, interleaved, load_pair, no_eos, prompts, ragged, summary,  # noqa: E402
                               write_results)
from locals.engine.load.backend import needs_fast_blas_reexec, reexec_with_fast_blas  # noqa: E402
from locals.engine.bench import run_locals, run_mlx_lm  # noqa: E402


# Variants of locals with one part turned off, each an engine of its own on the same weights:
# flag -> (runner name, how its engine differs (bench_engine's arguments), help).
BASELINES = {
    "untuned": ("locals-untuned", {"untuned": True},
                "also run locals with MLX's own ops (no tuned or fused kernels), when this chip is tuned"),
    "mlx_attention": ("locals-mlx-attention", {"decode_attention": False},
                      "also run locals with MLX's attention in decode steps (no decode attention kernel)"),
    "ungated": ("locals-ungated", {"gated": False},
                "also run locals with SwiGLU as MLX's op instead of inside the gate/up kernel"),
    "seams": ("locals-seams", {"whole_steps": False},
              "also run locals with decode steps as compiled seams around eager attention, not one "
              "compiled graph a step"),
    "scatter": ("locals-scatter", {"cache_writes": False},
                "also run locals with whole steps storing K/V with a scatter a layer, not written by the "
                "q/k head kernel"),
}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--random-model", default=None, help="qwen3-4b: random 4-bit Qwen3-4B shape (GPU)")
    ap.add_argument("--batches", default="1,2,4,8,16")
    ap.add_argument("--tokens", type=int, default=32, help="tokens generated per request")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--length-spread", type=int, default=0,
                    help="prompt lengths spread evenly over prompt-len .. prompt-len + this, so rows "
                         "decode at different lengths (attention then needs a mask; 0: all equal)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--with-lookup", action="store_true",
                    help="also run locals with prompt-lookup drafts on ('locals' runs without: this "
                         "benchmark measures batching; random weights repeat themselves, which drafts exploit)")
    for flag, (_, _, text) in BASELINES.items():
        ap.add_argument(f"--{flag.replace('_', '-')}-baseline", action="store_true", help=text)
    ap.add_argument("--unfused-baseline", action="store_true",
                    help="also run locals on a second copy of the model whose q/k/v and gate/up linears "
                         "stay apart (EngineConfig.fuse_projections off)")
    ap.add_argument("--dense-baseline", action="store_true",
                    help="also run mlx-lm on locals' (dense) weights, to separate weights from scheduling")
    return ap.parse_args()


def runners_for(args, engines: dict, ours, theirs, ps) -> dict:
    """The variants timed at one batch size, by name (`engines`: locals' variants by runner name)."""
    runners = {"locals": lambda: run_locals(engines["locals"], ps, args.tokens),
               "mlx-lm": lambda: run_mlx_lm(theirs, ps, args.tokens)}
    runners.update({name: (lambda e=engine: run_locals(e, ps, args.tokens))
                    for name, engine in engines.items() if name != "locals"})
    if args.dense_baseline and args.random_model is None:
        runners["mlx-lm-dense"] = lambda: run_mlx_lm(ours.model, ps, args.tokens)
    return runners


def tuning_choices() -> dict:
    """The tuning table the engine ran with: (layer shape -> rows -> choice), {} if none;
    two runs with different tables are different workloads for the kernels."""
    from locals.engine.kernels.tuning.tuner import load_table

    table = load_table()
    return table.choices if table is not None else {}


def main() -> None:
    args = parse_args()
    if needs_fast_blas_reexec():
        reexec_with_fast_blas()  # the CPU numbers assume OpenBLAS, like the CLI

    from locals.engine.engine import Engine
    from locals.engine.settings import EngineConfig

    ours, theirs, label = load_pair(args.random_model)
    ours = no_eos(ours)
    engine = bench_engine(ours)
    print(f"locals: {engine.patched_layers} layers use tuned kernels", flush=True)
    engines = {"locals": engine}
    for flag, (name, differs, _) in BASELINES.items():
        if getattr(args, f"{flag}_baseline"):
            engines[name] = bench_engine(ours, **differs)
    if args.with_lookup:
        engines["locals-lookup"] = Engine(ours, EngineConfig(prefix_cache_bytes=0, max_batch=256))
        engines["locals-lookup"].start()
    if args.unfused_baseline:  # the same weights again (random models are seeded), left as loaded
        engines["locals-unfused"] = Engine(no_eos(load_pair(args.random_model)[0]),
                                           EngineConfig(prefix_cache_bytes=0, max_batch=256, speculate=False,
                                                        fuse_projections=False))
        engines["locals-unfused"].start()
    rows, path = [], None

    def save():
        return write_results("batch_decode", {"model": label, "tokens": args.tokens, "prompt_len": args.prompt_len,
                                              "length_spread": args.length_spread,
                                              "rounds": args.rounds, "rows": rows, "argv": sys.argv[1:],
                                              "tuned_layers": engine.patched_layers,
                                              "tuning_choices": tuning_choices()}, path)

    try:
        for batch in [int(b) for b in args.batches.split(",")]:
            ps = ragged(prompts(ours.tokenizer, batch, args.prompt_len + args.length_spread, seed=batch),
                        args.prompt_len, args.length_spread)
            res = interleaved(args.rounds, runners_for(args, engines, ours, theirs, ps))
            row = {"batch": batch}
            for name, runs in res.items():
                row[name] = {key: summary([r[key] for r in runs]) for key in ("decode_tps", "ttft_s", "all_rows_tps")
                             if all(r.get(key) is not None for r in runs)}
            rows.append(row)
            line = "  ".join(f"{n}: {row[n]['decode_tps']['median']:.1f} tok/s ttft {row[n]['ttft_s']['median']:.2f}s"
                             + (f" (all rows {row[n]['all_rows_tps']['median']:.1f})"
                                if "all_rows_tps" in row[n] else "")
                             for n in res)
            print(f"B={batch:3d}  {line}", flush=True)
            path = save()  # after each batch size: a run cut short keeps what it measured
    finally:
        for e in engines.values():
            e.stop()
    print(f"results: {path}")


if __name__ == "__main__":
    main()
