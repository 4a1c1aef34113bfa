"""Load time and single-request decode speed of a model on this machine (issue: foundation).

Run it twice to compare BLAS: once as is (the script re-execs with OpenBLAS when
installed) and once with LOCALS_NO_OPENBLAS=1. Prints one JSON line.
    python benchmarks/load_and_decode.py --model smollm2 --tokens 64 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from locals.engine.load.backend import reexec_with_fast_blas


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    reexec_with_fast_blas()

    from mlx_lm.generate import stream_generate

    from locals.engine.load.models import load_model
    from locals.engine.load.templates import encode_prompt, render_prompt

    start = time.perf_counter()
    loaded = load_model(args.model)
    load_s = time.perf_counter() - start
    prompt = encode_prompt(loaded, render_prompt(loaded, [{"role": "user", "content": "Tell me a long story."}]))
    rates = []
    for _ in range(args.rounds):
        last = None
        for last in stream_generate(loaded.model, loaded.tokenizer, prompt, max_tokens=args.tokens):
            pass
        rates.append(last.generation_tps)
    print(json.dumps({
        "model": loaded.name, "backend": loaded.backend.kind, "blas": loaded.backend.blas,
        "load_s": round(load_s, 2), "decode_tok_s_median": round(statistics.median(rates), 1),
        "decode_tok_s_range": [round(min(rates), 1), round(max(rates), 1)], "rounds": args.rounds,
    }))


if __name__ == "__main__":
    main()
