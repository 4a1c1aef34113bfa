"""Build a Hugging Face fast tokenizer (wrapped for mlx-lm) from GGUF tokenizer metadata.

Supports the byte-level BPE ("gpt2") vocabularies of llama-family GGUFs; control tokens
are registered as special so `<|im_start|>` and friends encode to single ids.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, TokenizerWrapper
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from locals.errors import UnsupportedModel

CONTROL = 3  # llama.cpp token type of control tokens
# GPT-2's split pattern; llama.cpp's "smollm"/"starcoder" pre-tokenizers also split digits.
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
DIGIT_SPLIT_PRE = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}


def _int(meta: dict, key: str):
    value = meta.get(key)
    return int(value.item()) if isinstance(value, mx.array) else value


def _pre_tokenizer(pre: str | None):
    split = pre_tokenizers.Split(Regex(GPT2_PATTERN), behavior="isolated")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    steps = [split, byte_level]
    if pre in DIGIT_SPLIT_PRE:
        steps.insert(0, pre_tokenizers.Digits(individual_digits=True))
    return pre_tokenizers.Sequence(steps)


def build_tokenizer(meta: dict) -> TokenizerWrapper:
    """A TokenizerWrapper equivalent to the model's own tokenizer, from GGUF metadata."""
    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise UnsupportedModel(
            f"GGUF tokenizer {meta.get('tokenizer.ggml.model')!r} is not supported "
            "(byte-level BPE only); use the model's MLX version from Hugging Face."
        )
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tk.pre_tokenizer = _pre_tokenizer(meta.get("tokenizer.ggml.pre"))
    tk.decoder = decoders.ByteLevel()
    types = meta.get("tokenizer.ggml.token_type")
    types = types.tolist() if isinstance(types, mx.array) else list(types or [])
    specials = [tokens[i] for i, t in enumerate(types) if t == CONTROL]
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])

    def token(key: str) -> str | None:
        idx = _int(meta, key)
        return tokens[idx] if idx is not None and 0 <= idx < len(tokens) else None

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        bos_token=token("tokenizer.ggml.bos_token_id"),
        eos_token=token("tokenizer.ggml.eos_token_id"),
        unk_token=token("tokenizer.ggml.unknown_token_id"),
        pad_token=token("tokenizer.ggml.padding_token_id"),
        chat_template=meta.get("tokenizer.chat_template"),
        clean_up_tokenization_spaces=False,
    )
    return TokenizerWrapper(hf, detokenizer_class=BPEStreamingDetokenizer)


def continuation_detokenizer(tokenizer):
    """A streaming detokenizer that keeps the first token's leading space.

    mlx-lm's detokenizers drop it (a chat reply starts after the assistant header, where it
    is noise); a raw completion continues its prompt, where " Paris" after "is" is the text.
    """
    detok = tokenizer.detokenizer
    if hasattr(detok, "trim_space"):  # SentencePiece's
        detok.trim_space = False
    elif hasattr(detok, "_maybe_trim_space"):  # byte-level BPE's: trims only while its text is empty
        detok._maybe_trim_space = lambda text: text
    return detok
