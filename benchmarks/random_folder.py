"""A random-weight Qwen3-shaped 4-bit model written as an MLX folder that `locals serve` and
`mlx_lm.server` both load: config.json, safetensors, and a tokenizer covering the whole
vocabulary with a ChatML chat template that renders tools (Qwen's hermes format, so both
servers pick the `json_tools` parser).

The tokenizer is a byte-level BPE: the 256 byte tokens, merges that make every word of the
traffic benchmark's text (locals.traffic.workload.WORDS, with its leading space) one token,
syllable filler up to the vocabulary size so every id the random model samples decodes to
text, and the ChatML control tokens as special tokens at the end. `<tool_call>` is plain text
(several tokens), so random weights practically never open a tool call, and they rarely sample
`<|im_end|>`: replies run to max_tokens.
    python benchmarks/random_folder.py qwen3-tiny /tmp/qwen3-tiny-random
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import QWEN3_SHAPES  # noqa: E402
from locals.traffic.workload import WORDS  # noqa: E402

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
EOS = "<|im_end|>"

CHAT_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments' }}
{{- ' within <tool_call></tool_call> XML tags:\\n<tool_call>\\n' }}
{{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' %}
{{- '<|im_start|>assistant\\n' + (message.content or '') }}
{%- for tool_call in message.tool_calls or [] %}
{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\\n<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}
{{- (tool_call.arguments if tool_call.arguments is string else tool_call.arguments | tojson) + '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}
{%- elif message.role != 'system' or not loop.first %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""


def _syllables(i: int) -> str:
    consonants, vowels = "bdfgklmnprstvz", "aeiou"
    out = ""
    while True:
        i, digit = divmod(i, len(consonants) * len(vowels))
        out += consonants[digit // len(vowels)] + vowels[digit % len(vowels)]
        if i == 0:
            return out


def bpe_vocab(size: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """(vocab, merges) of `size` regular tokens: bytes, the benchmark's words, syllable filler."""
    from tokenizers import pre_tokenizers

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    merges = []
    for word in WORDS:
        piece = "Ġ" + word  # the byte-level alphabet's space
        for end in range(2, len(piece) + 1):
            if piece[:end] not in vocab:
                vocab[piece[:end]] = len(vocab)
                merges.append((piece[: end - 1], piece[end - 1]))
    if len(vocab) > size:
        raise SystemExit(f"a vocabulary of {size} cannot hold the benchmark's words ({len(vocab)} tokens)")
    i = 0
    while len(vocab) < size:  # reachable by no merge: only the model emits them
        vocab.setdefault("Ġ" + _syllables(i), len(vocab))
        i += 1
    return vocab, merges


def write_tokenizer(folder: Path, vocab_size: int, context: int) -> int:
    """tokenizer.json and tokenizer_config.json (the chat template inside, the class named as
    transformers 4 and 5 both know it): `vocab_size` ids in all, the control tokens last.
    Returns EOS's id."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab, merges = bpe_vocab(vocab_size - len(SPECIALS))
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    tk.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "pad_token": SPECIALS[0],
              "bos_token": None, "add_bos_token": False, "clean_up_tokenization_spaces": False,
              "model_max_length": context, "chat_template": CHAT_TEMPLATE}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return tk.token_to_id(EOS)


def write_random_qwen3(folder: Path, shape: str, seed: int = 0) -> Path:
    """The model folder: config.json, 4-bit (group 64) random weights, the tokenizer."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models import qwen3
    from mlx_lm.utils import save_config, save_model

    if shape not in QWEN3_SHAPES:
        raise SystemExit(f"unknown shape {shape!r}; known: {', '.join(QWEN3_SHAPES)}")
    context = 40960
    config = {"model_type": "qwen3", "rms_norm_eps": 1e-6, "max_position_embeddings": context,
              "rope_theta": 1_000_000.0, "tie_word_embeddings": True, **QWEN3_SHAPES[shape],
              "quantization": {"group_size": 64, "bits": 4}, "torch_dtype": "bfloat16"}
    folder.mkdir(parents=True, exist_ok=True)
    config["eos_token_id"] = write_tokenizer(folder, config["vocab_size"], context)
    mx.random.seed(seed)
    model = qwen3.Model(qwen3.ModelArgs.from_dict(config))
    model.set_dtype(mx.bfloat16)
    nn.quantize(model, group_size=64, bits=4)
    mx.eval(model.parameters())
    save_model(folder, model, donate_model=True)
    save_config(config, folder / "config.json")
    mx.clear_cache()  # the servers, not this process, need the device's memory next
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", choices=sorted(QWEN3_SHAPES))
    parser.add_argument("folder", type=Path)
    args = parser.parse_args()
    print(write_random_qwen3(args.folder, args.shape))


if __name__ == "__main__":
    main()
