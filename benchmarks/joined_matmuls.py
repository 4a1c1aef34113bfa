"""Joined q/k/v and gate/up matmuls (locals/engine/forward/fuse.py) against the parts, per batch size:
engine decode tok/s with joined matmuls up to several token counts a pass (ForwardChoices'
`joined_*_max_tokens`), with the fused kernels (kernels/fused.py: q/k norm + RoPE, add + norm;
where attached) and with MLX's ops for them ("-mlx-ops"), an engine a variant, interleaved rounds.

    python benchmarks/joined_matmuls.py --random-model qwen3-4b --batches 1,4,8,16 --separate
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (bench_engine, interleaved, load_pair, no_eos, prompts, summary,  # noqa: E402
                               write_results)
from locals.engine.load.backend import needs_fast_blas_reexec, reexec_with_fast_blas  # noqa: E402
from locals.engine.bench import run_locals  # noqa: E402

ALWAYS, NEVER = 1 << 30, 0
# name -> (q/k/v joined up to this many tokens a pass, gate/up joined up to, fused kernels)
VARIANTS = {
    "joined": (ALWAYS, ALWAYS, True),
    "joined-4-tokens": (4, 4, True),
    "parts": (NEVER, NEVER, True),
    "joined-mlx-ops": (ALWAYS, ALWAYS, False),
    "joined-4-tokens-mlx-ops": (4, 4, False),
}


def variant_engine(loaded, setting: tuple[int, int, bool]):
    """An engine with the joined matmuls used up to `setting` tokens a pass, and the fused kernels
    or MLX's ops for them."""
    qkv, gate_up, fused = setting
    return bench_engine(loaded, joined_qkv_max_tokens=qkv, joined_gate_up_max_tokens=gate_up, fused=fused)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--random-model", default=None, help="qwen3-4b on a GPU; default: the embedded model")
    ap.add_argument("--batches", default="1,4,8,16")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--separate", action="store_true",
                    help="also run a second engine on an unjoined copy of the model ('separate': the "
                         "parts as loaded, not as views of a joined weight)")
    args = ap.parse_args()
    if needs_fast_blas_reexec():
        reexec_with_fast_blas()

    from locals.engine.engine import Engine
    from locals.engine.settings import EngineConfig

    ours, _theirs, label = load_pair(args.random_model)
    ours = no_eos(ours)
    engines = {name: variant_engine(ours, setting) for name, setting in VARIANTS.items()}
    engine = engines["joined"]
    if args.separate:
        engines["separate"] = Engine(no_eos(load_pair(args.random_model)[0]),
                                     EngineConfig(prefix_cache_bytes=0, max_batch=256, speculate=False,
                                                  fuse_projections=False))
        engines["separate"].start()
    print(f"locals: {engine.fused_groups} groups joined, {engine.patched_layers} layers use tuned kernels, "
          f"fused kernels in {engine.fused_kernel_layers} layers", flush=True)
    rows, path = [], None
    try:
        for batch in [int(b) for b in args.batches.split(",")]:
            ps = prompts(ours.tokenizer, batch, args.prompt_len, seed=batch)
            runners = {name: (lambda e=e: run_locals(e, ps, args.tokens)) for name, e in engines.items()}
            res = interleaved(args.rounds, runners)
            row = {"batch": batch, **{n: {"decode_tps": summary([r["decode_tps"] for r in runs])}
                                      for n, runs in res.items()}}
            rows.append(row)
            print(f"B={batch:3d}  " + "  ".join(f"{n}: {row[n]['decode_tps']['median']:.1f}" for n in res), flush=True)
            path = write_results("joined_matmuls", {"model": label, "tokens": args.tokens, "rounds": args.rounds,
                                                    "variants": VARIANTS, "rows": rows, "argv": sys.argv[1:],
                                                    "tuned_layers": engine.patched_layers,
                                                    "fused_kernel_layers": engine.fused_kernel_layers}, path)
    finally:
        for e in engines.values():
            e.stop()
    print(f"results: {path}")


if __name__ == "__main__":
    main()
