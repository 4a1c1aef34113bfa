"""Write the embedded GGUF model as an MLX model folder, for side-by-side runs with mlx-lm.

mlx-lm cannot read the GGUF, so benchmarks that run `mlx_lm.server` or BatchGenerator on
"the same weights" export them once: quantized as in the file (MLX affine, group 32,
bits per tensor) or dequantized to float32 with `--dense`.
    python -m locals.engine.load.export smollm2 /tmp/smollm2-mlx [--dense]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from locals.engine.load import gguf
from locals.engine.load.models import resolve
from locals.engine.load.tokenizer import build_tokenizer


def export_mlx(name: str, out: Path, dense: bool = False) -> Path:
    """Export a GGUF model (by name or path) to an MLX folder that mlx_lm.load reads."""
    kind, path, _ = resolve(name)
    if kind != "gguf":
        raise ValueError(f"{name} is already an MLX model ({path})")
    tensors, meta = gguf.read_gguf(Path(path))
    args = gguf.model_args(meta, tensors)
    model, quantized = gguf.build_model(tensors, args, dense=dense)
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())),
                        metadata={"format": "mlx"})
    config = {k: v for k, v in vars(args).items() if k != "layer_types"}
    if quantized:
        bits = sorted(set(quantized.values()))
        config["quantization"] = {"group_size": gguf.GROUP_SIZE, "bits": bits[0]}
        config["quantization"].update({p: {"group_size": gguf.GROUP_SIZE, "bits": b}
                                       for p, b in quantized.items() if b != bits[0]})
    tokenizer = build_tokenizer(meta)
    config["eos_token_id"] = sorted(tokenizer.eos_token_ids)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer._tokenizer.save_pretrained(str(out))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("out", type=Path)
    parser.add_argument("--dense", action="store_true", help="dequantize to float32")
    args = parser.parse_args()
    print(export_mlx(args.model, args.out, dense=args.dense))


if __name__ == "__main__":
    main()
