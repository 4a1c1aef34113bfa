"""The embedded GGUF exported as an MLX folder loads in mlx-lm (for side-by-side benchmarks)."""

from __future__ import annotations

import json

import pytest


@pytest.mark.model
@pytest.mark.parametrize("dense", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_export_loads_in_mlx_lm(tmp_path, dense):
    from mlx_lm import generate, load

    from locals.engine.load.export import export_mlx

    out = export_mlx("smollm2", tmp_path / "m", dense=dense)
    config = json.loads((out / "config.json").read_text())
    assert ("quantization" in config) is (not dense)
    model, tokenizer = load(str(out))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                           add_generation_prompt=True)
    assert "Paris" in generate(model, tokenizer, prompt, max_tokens=15)
