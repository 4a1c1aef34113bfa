"""Load llama-family GGUF files (F32, F16, Q4_0, Q4_1, Q8_0) into mlx-lm's llama model.

MLX reads the file (`mx.load`); quantized tensors arrive as affine (weight, scales,
biases) with group size 32. On the CPU backend they are dequantized to float32,
because MLX's CPU quantized matmul is ~10x slower than dense f32 with OpenBLAS.
Elsewhere they stay quantized. The tokenizer and chat template come from the metadata.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama

from locals.errors import UnsupportedModel

SUPPORTED_ARCHITECTURES = {"llama"}
GROUP_SIZE = 32

_NAME_MAP = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_MAP = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def read_gguf(path: Path) -> tuple[dict[str, mx.array], dict]:
    """Tensors and metadata of a GGUF file; raises UnsupportedModel for unreadable files."""
    try:
        tensors, meta = mx.load(str(path), return_metadata=True)
    except Exception as exc:  # mlx raises a bare ValueError/RuntimeError for unknown quant types
        raise UnsupportedModel(
            f"{path.name}: cannot read this GGUF ({exc}); locals reads F32, F16, Q4_0, Q4_1 and "
            "Q8_0 llama-family files. Use the model's MLX version from Hugging Face instead."
        ) from None
    return tensors, meta


def _meta_int(meta: dict, key: str, default=None):
    value = meta.get(key, default)
    return int(value.item()) if isinstance(value, mx.array) else value


def _meta_float(meta: dict, key: str, default=None):
    value = meta.get(key, default)
    return float(value.item()) if isinstance(value, mx.array) else value


def model_args(meta: dict, tensors: dict) -> llama.ModelArgs:
    """llama.ModelArgs from GGUF metadata; refuses architectures other than llama."""
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModel(
            f"GGUF architecture {arch!r} is not supported (only llama-family GGUF files load); "
            "use the model's MLX version from Hugging Face (mlx-community/...)."
        )
    p = f"{arch}."
    hidden = _meta_int(meta, p + "embedding_length")
    heads = _meta_int(meta, p + "attention.head_count")
    vocab = _meta_int(meta, p + "vocab_size") or len(meta["tokenizer.ggml.tokens"])
    return llama.ModelArgs(
        model_type="llama",
        hidden_size=hidden,
        num_hidden_layers=_meta_int(meta, p + "block_count"),
        intermediate_size=_meta_int(meta, p + "feed_forward_length"),
        num_attention_heads=heads,
        num_key_value_heads=_meta_int(meta, p + "attention.head_count_kv", heads),
        rms_norm_eps=_meta_float(meta, p + "attention.layer_norm_rms_epsilon", 1e-5),
        vocab_size=vocab,
        rope_theta=_meta_float(meta, p + "rope.freq_base", 10000.0),
        # GGUF permutes q/k for the interleaved rotary layout.
        rope_traditional=True,
        max_position_embeddings=_meta_int(meta, p + "context_length"),
        tie_word_embeddings="output.weight" not in tensors,
    )


def _mlx_name(gguf_name: str) -> str:
    stem, _, suffix = gguf_name.rpartition(".")
    if stem.startswith("blk."):
        _, layer, part = stem.split(".", 2)
        if part not in _LAYER_MAP:
            raise UnsupportedModel(f"unexpected GGUF tensor {gguf_name!r} for a llama model")
        return f"model.layers.{layer}.{_LAYER_MAP[part]}.{suffix}"
    if stem not in _NAME_MAP:
        raise UnsupportedModel(f"unexpected GGUF tensor {gguf_name!r} for a llama model")
    return f"{_NAME_MAP[stem]}.{suffix}"


def _bits(weight: mx.array, scales: mx.array) -> int:
    in_features = scales.shape[-1] * GROUP_SIZE
    return weight.shape[-1] * 32 // in_features


def build_model(tensors: dict, args: llama.ModelArgs, dense: bool) -> tuple[llama.Model, dict]:
    """The llama model with GGUF weights loaded; `dense` dequantizes to float32.

    Returns the model and a {module path: bits} map of what stayed quantized.
    """
    renamed = {_mlx_name(k): v for k, v in tensors.items()}
    quantized = {k[: -len(".scales")]: _bits(renamed[k[: -len(".scales")] + ".weight"], v)
                 for k, v in renamed.items() if k.endswith(".scales")}
    if dense:
        # Scales and biases in float32 (as llama.cpp computes d * q + m): MLX's CPU dequantize in
        # their float16 took 1.9 s for SmolLM2-135M against 0.6 (docs/benchmarks-log.md, "CPU: a
        # start's dequantize in float32").
        for path, bits in quantized.items():
            renamed[path + ".weight"] = mx.dequantize(
                renamed.pop(path + ".weight"), renamed.pop(path + ".scales").astype(mx.float32),
                renamed.pop(path + ".biases").astype(mx.float32), group_size=GROUP_SIZE, bits=bits,
            )
        renamed = {k: v.astype(mx.float32) for k, v in renamed.items()}
        quantized = {}
    model = llama.Model(args)
    if quantized:
        nn.quantize(
            model,
            class_predicate=lambda p, m: (
                {"group_size": GROUP_SIZE, "bits": quantized[p]} if p in quantized else False
            ),
        )
    model.load_weights(list(renamed.items()), strict=True)
    mx.eval(model.parameters())
    return model, quantized
