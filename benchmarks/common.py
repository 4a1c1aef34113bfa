"""Helpers shared by the benchmark scripts: models to compare on, interleaved rounds,
median/range summaries and JSON results under benchmarks/results/.

Benchmarks compare locals' engine with mlx-lm's BatchGenerator in one process, on the
same weights and prompts, alternating the two each round so drift hits both alike.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path

from locals.engine.bench import bench_prompts as prompts  # noqa: F401  (re-exported for the scripts)
from locals.measure import interleaved, summary  # noqa: F401
from locals.engine.bench import without_eos as no_eos  # noqa: F401

RESULTS = Path(__file__).parent / "results"


def as_peer(run):
    """Wrap a peer's runner whose first argument is the model: it runs on the model's twin with
    MLX's own ops (kernels/twin.py), whatever tuned kernels locals' engine swapped into the model."""
    import functools

    from locals.engine.kernels import mlx_ops_twin

    @functools.wraps(run)
    def wrapped(model, *args, **kwargs):
        return run(mlx_ops_twin(model), *args, **kwargs)

    return wrapped


def bench_engine(loaded, *, untuned: bool = False, profile=None, on_queue=None, **choices):
    """A started Engine as the benchmarks run it (no prompt cache, no drafts, up to 256 rows), its
    forward passes made with `choices` (ForwardChoices fields); `untuned`: MLX's own ops, on a twin
    of the model (the same weights, none of the kernels another engine patched into it).
    `profile` and `on_queue`: the step runner's hooks (locals/engine/step.py)."""
    import dataclasses

    from locals.engine.engine import Engine
    from locals.engine.forward.choices import ForwardChoices
    from locals.engine.kernels import mlx_ops_twin
    from locals.engine.settings import EngineConfig

    if untuned:
        loaded = dataclasses.replace(loaded, model=mlx_ops_twin(loaded.model))
    config = EngineConfig(prefix_cache_bytes=0, max_batch=256, speculate=False, tuned_kernels=not untuned,
                          forward=ForwardChoices(**choices))
    engine = Engine(loaded, config)
    engine.runner.profile, engine.runner.on_queue = profile, on_queue
    engine.start()
    return engine


def ragged(ps: list[list[int]], shortest: int, spread: int) -> list[list[int]]:
    """Prompt i cut to `shortest` + i/(n-1) of `spread` tokens (all `shortest` + spread when spread is 0)."""
    if not spread:
        return ps
    n = len(ps)
    return [p[: shortest + (i * spread) // max(n - 1, 1)] for i, p in enumerate(ps)]


# The MLX settings the run was started with, taken before locals sets its own defaults in this
# process (backend.keep_compiled_kernels, cuda_launch_settings): a results file records the user's.
USER_MLX_ENV = {k: v for k, v in os.environ.items() if k.startswith("MLX_")}


def write_results(name: str, data: dict, path: Path | None = None) -> Path:
    """Write `data` (plus machine info and the command line) as benchmarks/results/<name>-<device>-<time>.json,
    or over `path` (a run that saves what it has after each part, so a cut-off run keeps it)."""
    import mlx.core as mx

    RESULTS.mkdir(parents=True, exist_ok=True)
    device = "gpu" if mx.default_device() == mx.gpu else "cpu"
    gpu = dict(mx.device_info()).get("device_name") if device == "gpu" else None
    data = {"benchmark": name, "device": device, **({"device_name": gpu} if gpu else {}), "machine": platform.machine(),
            "mlx": mx.__version__, "when": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv[1:],
            "mlx_env": USER_MLX_ENV,
            "locals_env": {k: v for k, v in os.environ.items()
                           if k.startswith("LOCALS_") and k not in ("LOCALS_HOME",)}, **data}
    path = path or RESULTS / f"{name}-{device}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(data, indent=1))
    return path


# Random-weight Qwen3 shapes: the real 4B one (GPU) and a tiny one that tries the scripts on a CPU.
QWEN3_SHAPES = {
    "qwen3-4b": dict(hidden_size=2560, num_hidden_layers=36, intermediate_size=9728,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936),
    "qwen3-tiny": dict(hidden_size=256, num_hidden_layers=2, intermediate_size=512,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=4096),
}


def random_qwen3(reference, shape: str):
    """A Qwen3-shaped model with random weights, 4-bit (group 64), sharing `reference`'s tokenizer."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models import qwen3

    args = qwen3.ModelArgs(
        model_type="qwen3", rms_norm_eps=1e-6, max_position_embeddings=40960, rope_theta=1_000_000.0,
        tie_word_embeddings=True, **QWEN3_SHAPES[shape],
    )
    mx.random.seed(0)
    model = qwen3.Model(args)
    model.set_dtype(mx.bfloat16)
    nn.quantize(model, group_size=64, bits=4)
    mx.eval(model.parameters())
    return dataclasses.replace(reference, model=model, name=f"{shape}-random", model_id="random",
                               vocab_size=args.vocab_size, context_length=40960)


def byte_tokenizer():
    """A byte-level tokenizer (256 tokens, no merges) for random-weight models: prompts are
    token ids anyway, and it needs no model files."""
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, TokenizerWrapper
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tk = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))}, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    return TokenizerWrapper(PreTrainedTokenizerFast(tokenizer_object=tk), detokenizer_class=BPEStreamingDetokenizer)


def load_pair(random_model: str | None):
    """(locals' model, mlx-lm's model, label): the weights each side runs.

    CPU, embedded model: locals runs dense f32 (its CPU path), mlx-lm the GGUF's
    quantized weights as MLX loads them. With a random model both run the same weights.
    """
    from locals.engine.load import backend
    from locals.engine.load import gguf
    from locals.engine.load.models import LoadedModel, embedded_gguf_path, load_model

    if random_model in QWEN3_SHAPES:
        shell = LoadedModel(model=None, tokenizer=byte_tokenizer(), name="", model_id="", vocab_size=0,
                            context_length=0, tool_format="json_tools", tools_in_template=False,
                            backend=backend.detect())
        ours = random_qwen3(shell, random_model)
        return ours, ours.model, f"{random_model} random 4-bit"
    if random_model:
        raise SystemExit(f"unknown --random-model {random_model!r}; known: {', '.join(QWEN3_SHAPES)}")
    loaded = load_model("smollm2")
    tensors, meta = gguf.read_gguf(embedded_gguf_path())
    quantized, _ = gguf.build_model(tensors, gguf.model_args(meta, tensors), dense=False)
    return loaded, quantized, "SmolLM2-135M (locals: dense f32; mlx-lm: GGUF Q4_1/Q8_0 as loaded)"
