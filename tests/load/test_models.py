"""Model resolution, the GGUF loader on the embedded file, tokenizer and chat templates."""

from __future__ import annotations

import json

import pytest

from locals.engine.load import catalog

from locals.engine.load import models
from locals.engine.load.catalog import GIB
from locals.errors import ModelNotFound, UnsupportedModel


def test_alias_resolution():
    assert models.resolve("qwen") == ("hf", "mlx-community/Qwen3.5-4B-MLX-4bit", False)
    assert models.resolve("lfm-thinking") == ("hf", "mlx-community/LFM2.5-2.6B-4bit", True)
    assert models.resolve("locals/qwen3.5-2b") == ("hf", "mlx-community/Qwen3.5-2B-MLX-4bit", False)
    kind, path, _ = models.resolve("smollm2")
    assert kind == "gguf" and path.endswith(".gguf")


def test_ollama_names():
    assert models.resolve("qwen3.5:4b")[1] == "mlx-community/Qwen3.5-4B-MLX-4bit"
    assert models.resolve("smollm2:135m")[0] == "gguf"
    assert models.resolve("llama3.2:3b")[1] == "mlx-community/Llama-3.2-3B-Instruct-4bit"
    with pytest.raises(ModelNotFound, match=r"mlx-community/phi9-14b-4bit"):
        models.resolve("phi9:14b")


def test_repo_folder_and_gguf_paths(tmp_path):
    assert models.resolve("someone/some-model") == ("hf", "someone/some-model", False)
    with pytest.raises(ModelNotFound, match="no such GGUF"):
        models.resolve(str(tmp_path / "x.gguf"))
    (tmp_path / "m").mkdir()
    with pytest.raises(ModelNotFound, match="config.json"):
        models.resolve(str(tmp_path / "m"))
    (tmp_path / "m" / "config.json").write_text("{}")
    assert models.resolve(str(tmp_path / "m"))[0] == "folder"
    with pytest.raises(ModelNotFound):
        models.resolve("not a model")


def test_unsupported_gguf_is_refused(tmp_path):
    bad = tmp_path / "junk.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(UnsupportedModel, match="MLX version"):
        models.load_model(str(bad))


def test_hf_repo_offline_names_embedded_model():
    with pytest.raises(Exception, match="--model smollm2"):
        models.load_model("someone/not-downloaded-model")


@pytest.mark.parametrize("kind,mem,expected", [
    ("cpu", 64 * GIB, "smollm2"), ("metal", 16 * GIB, "qwen"), ("metal", 8 * GIB, "qwen3.5-2b"),
    ("cuda", 80 * GIB, "qwen"), ("cuda", 6 * GIB, "qwen3.5-2b"), ("metal", 12 * GIB, "qwen"),
])
def test_default_model_per_backend(kind, mem, expected):
    assert catalog.default_alias(kind, mem) == expected


@pytest.mark.model
def test_embedded_model_answers_paris(smollm2):
    from mlx_lm import generate

    from locals.engine.load.templates import encode_prompt, render_prompt

    prompt = render_prompt(smollm2, [{"role": "user", "content": "What is the capital of France?"}])
    text = generate(smollm2.model, smollm2.tokenizer, encode_prompt(smollm2, prompt), max_tokens=20)
    assert "Paris" in text


def test_special_tokens_are_single_ids(smollm2):
    tok = smollm2.tokenizer
    for special in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        ids = tok.encode(special, add_special_tokens=False)
        assert len(ids) == 1, special
    assert tok.decode(tok.encode("def f(x):\n    return x + 1  # ünïcode")) .endswith("ünïcode")
    assert smollm2.tokenizer.eos_token_ids == {tok.convert_tokens_to_ids("<|im_end|>")}


def test_template_matches_transformers(smollm2):
    """Our rendering equals transformers' apply_chat_template with the GGUF's template string."""
    from transformers import PreTrainedTokenizerFast

    from locals.engine.load.templates import render_prompt

    reference = PreTrainedTokenizerFast(tokenizer_object=smollm2.tokenizer._tokenizer.backend_tokenizer,
                                        chat_template=smollm2.tokenizer.chat_template)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}]
    for gen in (True, False):
        expected = reference.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
        assert render_prompt(smollm2, msgs, add_generation_prompt=gen) == expected


TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:{% for t in tools %}\n{{ t | tojson }}{% endfor %}<|im_end|>\n"
    "{%- endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{%- if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function.name }} "
    "{{ c.function.arguments | tojson }}</tool_call>{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]


def test_template_with_tools_matches_transformers(smollm2):
    """A model whose template renders tools keeps its own rendering, tool calls included."""
    import dataclasses

    from transformers import PreTrainedTokenizerFast

    from locals.engine.load.templates import render_prompt

    hf = PreTrainedTokenizerFast(tokenizer_object=smollm2.tokenizer._tokenizer.backend_tokenizer,
                                 chat_template=TOOL_TEMPLATE)
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    loaded = dataclasses.replace(smollm2, tokenizer=TokenizerWrapper(hf), tools_in_template=True)
    msgs = [{"role": "user", "content": "read a.txt"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "hello"}]
    expected_msgs = [dict(m) for m in msgs]
    expected_msgs[1] = {**msgs[1], "tool_calls": [{**msgs[1]["tool_calls"][0], "function": {
        "name": "read_file", "arguments": {"path": "a.txt"}}}]}
    expected = hf.apply_chat_template(expected_msgs, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert render_prompt(loaded, msgs, tools=TOOLS) == expected
    assert '<tool_call>read_file {"path": "a.txt"}</tool_call>' in expected


def test_injected_tools_for_templates_without_tools(smollm2):
    from locals.engine.load.templates import render_prompt

    msgs = [{"role": "user", "content": "read a.txt"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "hello"}]
    text = render_prompt(smollm2, msgs, tools=TOOLS)
    assert text.startswith("<|im_start|>system\n# Tools")
    assert json.dumps(TOOLS[0]["function"]) in text
    assert '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\nhello\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_tiny_llama_runs(tiny_llama):
    import mlx.core as mx

    logits = tiny_llama.model(mx.array([[1, 2, 3]]))
    assert logits.shape == (1, 3, tiny_llama.vocab_size)


def test_embedded_weights_on_the_cpu_are_the_files_values_dequantized_in_float32(smollm2):
    # What llama.cpp computes from a Q4_1/Q8_0 block: d * q + m in float32, q read low bits first.
    import mlx.core as mx
    import numpy as np

    from locals.engine.load import gguf

    if not smollm2.backend.dense_weights:
        pytest.skip("the weights stay quantized on this backend")
    tensors, _ = gguf.read_gguf(models.embedded_gguf_path())
    layer = smollm2.model.model.layers[3]
    for name, module in (("blk.3.attn_q", layer.self_attn.q_proj), ("blk.3.ffn_down", layer.mlp.down_proj),
                         ("token_embd", smollm2.model.model.embed_tokens)):
        packed = np.asarray(tensors[f"{name}.weight"]).view(np.uint8)
        scales, biases = (np.asarray(tensors[f"{name}.{part}"].astype(mx.float32)) for part in ("scales", "biases"))
        bits = gguf._bits(tensors[f"{name}.weight"], tensors[f"{name}.scales"])
        q = np.stack([packed & 0xF, packed >> 4], axis=-1) if bits == 4 else packed
        groups = q.reshape(*scales.shape, gguf.GROUP_SIZE).astype(np.float32)
        want = (groups * scales[..., None] + biases[..., None]).reshape(packed.shape[0], -1)
        assert module.weight.dtype == mx.float32
        np.testing.assert_array_equal(np.asarray(module.weight), want)


def test_thinking_is_off_unless_the_name_asks_for_it():
    # Qwen3's templates think unless told not to, and mlx-lm's wrapper turns thinking on for a
    # vocabulary with <think>: the template is told either way.
    from types import SimpleNamespace

    from locals.engine.load.templates import render_prompt

    seen = []

    class Tokenizer:
        def apply_chat_template(self, messages, **kwargs):
            seen.append(kwargs.get("enable_thinking"))
            return "prompt"

    for thinking in (False, True):
        loaded = SimpleNamespace(tokenizer=Tokenizer(), thinking=thinking, tools_in_template=True)
        render_prompt(loaded, [{"role": "user", "content": "hi"}])
        for asked in (False, True):  # a request's own switch wins over the name
            render_prompt(loaded, [{"role": "user", "content": "hi"}], thinking=asked)
    assert seen == [False, False, True, True, False, True]
