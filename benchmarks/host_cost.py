"""Host cost of a decode step, per batch size, on a model whose compute is negligible (a
dense random Qwen3: hidden 64, vocab 512, 2 layers or `--layers`): milliseconds per step,
of which building the step's graph in Python and MLX queuing it, and the MLX ops each
step queues (graph primitives, a measure that does not depend on machine load).

What grows with the batch here is per-row Python and per-row MLX ops, the work that made
large batches host-bound on a GPU (benchmarks/step_profile.py).
    python benchmarks/host_cost.py --batches 1,8,32 [--layers 36]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlx.core as mx  # noqa: E402

from benchmarks.common import bench_engine, byte_tokenizer, no_eos, prompts, write_results  # noqa: E402
from benchmarks.step_ops import OpNames  # noqa: E402
from benchmarks.step_profile import StepClock  # noqa: E402
from locals.engine.bench import run_locals  # noqa: E402


def tiny_qwen3(layers: int = 2):
    """A LoadedModel of a dense random Qwen3 too small for its compute to matter."""
    from mlx_lm.models import qwen3

    from locals.engine.load import backend
    from locals.engine.load.models import LoadedModel

    args = qwen3.ModelArgs(model_type="qwen3", hidden_size=64, num_hidden_layers=layers, intermediate_size=128,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512,
                           rms_norm_eps=1e-6, max_position_embeddings=4096, rope_theta=1e6,
                           tie_word_embeddings=True)
    mx.random.seed(0)
    model = qwen3.Model(args)
    mx.eval(model.parameters())
    return LoadedModel(model=model, tokenizer=byte_tokenizer(), name="qwen3-host-random", model_id="random",
                       vocab_size=512, context_length=4096, tool_format="json_tools", tools_in_template=False,
                       backend=backend.detect())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5, help="timed runs per batch size (median reported)")
    ap.add_argument("--layers", type=int, default=2, help="decoder layers (36: Qwen3-4B's count, per-layer cost)")
    args = ap.parse_args()

    model = no_eos(tiny_qwen3(args.layers))
    clock, ops = StepClock(), OpNames()
    engine = bench_engine(model, profile=clock.record, on_queue=ops)
    rows = []
    try:
        for batch in [int(b) for b in args.batches.split(",")]:
            ps = prompts(model.tokenizer, batch, 16, seed=batch)
            run_locals(engine, ps, 8)  # warm-up
            runs = []
            for _ in range(args.rounds):
                clock.reset()
                run_locals(engine, ps, args.tokens)
                runs.append(clock.report())
            rows.append({"batch": batch, **{f"{part}_ms": statistics.median(r[part] for r in runs)
                                            for part in ("step", "forward", "async_eval")},
                         "step_ms_runs": [r["step"] for r in runs], "forward_ms_runs": [r["forward"] for r in runs]})
        ops.on = True  # counted apart from the timed runs: writing the dot files costs time
        for row in rows:
            ops.steps.clear()
            run_locals(engine, prompts(model.tokenizer, row["batch"], 16, seed=row["batch"]), 24)
            row["ops_per_step"] = statistics.median(sum(step.values()) for step in ops.steps)
            print(f"B={row['batch']:3d} step {row['step_ms']:.3f} ms (building the graph in Python "
                  f"{row['forward_ms']:.3f}, queuing it {row['async_eval_ms']:.3f})  ops/step "
                  f"{row['ops_per_step']:.0f}", flush=True)
    finally:
        engine.stop()
    path = write_results("host_cost", {"model": f"qwen3 dense random, hidden 64, {args.layers} layers, vocab 512",
                                       "tokens": args.tokens, "rows": rows})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
