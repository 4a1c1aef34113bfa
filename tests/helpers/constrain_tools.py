"""Tool lists and drivers for constraint tests: scripted text fed through an automaton's
masks, and the embedded model sampled in a batch under constraints."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from locals.engine.constrain.apply import apply_bitmasks

S = {"type": "string"}
PERSON = {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                           "email": S}, "required": ["name", "age"]}


def fn(name, props, required, description=None):
    """An OpenAI function tool; its description is "NAME tool" unless given."""
    return {"type": "function", "function": {"name": name, "description": description or f"{name} tool",
                                             "parameters": {"type": "object", "properties": props,
                                                            "required": required}}}


TOOLS = [fn("read_file", {"path": S, "limit": {"type": "integer", "minimum": 1, "maximum": 100}}, ["path"], "read_file"),
         fn("read", {"path": S}, ["path"], "read"),
         fn("run", {"command": S}, ["command"], "run")]


def allowed(mask, token: int) -> bool:
    row = np.array(mask)
    return bool((int(row[token >> 5]) >> (token & 31)) & 1)


def feed(constraint, text: str, tokenizer) -> None:
    for token in tokenizer.encode(text, add_special_tokens=False):
        mask = constraint.mask()
        assert mask is None or allowed(mask, token), (text, token)
        constraint.accept(token)


CODING_TOOLS = [
    fn("read_file", {"path": S, "offset": {"type": "integer", "minimum": 0}}, ["path"]),
    fn("write_file", {"path": S, "content": S}, ["path", "content"]),
    fn("edit_file", {"path": S, "old": S, "new": S}, ["path", "old", "new"]),
    fn("list_dir", {"path": S, "recursive": {"type": "boolean"}}, ["path"]),
    fn("search", {"pattern": S, "glob": S}, ["pattern"]),
    fn("run", {"command": S, "timeout": {"type": "integer", "minimum": 1, "maximum": 600}}, ["command"]),
]


def generate(loaded, prompt, constraints, max_tokens, *, temperature=1.5, seed=0):
    """Sample one row per constraint from `prompt`; forced tokens are fed one per step."""
    batch = len(constraints)
    cache = make_prompt_cache(loaded.model)
    logits = loaded.model(mx.array([prompt]), cache=cache)[:, -1, :]
    for layer in cache:
        layer.keys = mx.repeat(layer.keys[..., : layer.offset, :], batch, axis=0)
        layer.values = mx.repeat(layer.values[..., : layer.offset, :], batch, axis=0)
    logits = mx.repeat(logits, batch, axis=0)
    mx.random.seed(seed)
    ones = mx.full(((loaded.vocab_size + 31) // 32,), 0xFFFFFFFF, dtype=mx.uint32)
    eos = loaded.tokenizer.eos_token_ids
    outs = [[] for _ in range(batch)]
    done = [False] * batch
    while not all(done):
        masks = mx.stack([m if (m := c.mask()) is not None else ones for c in constraints])
        masked = apply_bitmasks(logits.astype(mx.float32), masks)
        sampled = mx.random.categorical(masked / temperature).tolist()
        step = []
        for row, c in enumerate(constraints):
            token = 0
            if not done[row]:
                forced = c.forced_tokens()
                token = forced[0] if forced else sampled[row]
                c.accept(token)
                outs[row].append(token)
                done[row] = token in eos or c.is_complete() or len(outs[row]) >= max_tokens[row]
            step.append(token)
        logits = loaded.model(mx.array(step)[:, None], cache=cache)[:, -1, :]
    return [loaded.tokenizer.decode([t for t in out if t not in eos]) for out in outs]
