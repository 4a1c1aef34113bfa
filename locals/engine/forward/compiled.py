"""Compiled graphs of a model's decode passes, traced once per shape and replayed each step.

Two forms, both owned by the engine that runs the model (`CompiledBlocks`):
- a whole decode step (`step`): the embedding, every layer with its K/V write and attention,
  and the head, in one compiled call. Used when every row of the pass is in the decode batch,
  brings one token and samples it: the graph's shapes (rows, the batch's capacity) then stay
  put from step to step, so Python builds nothing a layer.
- the seams between attention calls (`seams`): for other short passes (forced tokens, drafts,
  rows reading a prompt in the same pass), whose attention needs per-pass slicing.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import mlx.core as mx

from locals.engine.forward.choices import ForwardChoices
from locals.engine.forward.layer_pass import finish, lm_head, project
from locals.engine.kernels.decode_attention import active_for as attention_kernel
from locals.engine.kernels.decode_attention import reference as attention_reference
from locals.engine.kernels.registry import swap_count

STEP_GRAPHS = 160  # whole-step graphs kept (every shape warmup.py compiles), least recently used dropped
# Passes through the seams are padded to a power of two tokens up to this many, then to a multiple
# of it: a compile limit past it (a prompt chunk beside decoding rows) meets a few lengths, none
# padded by more than this.
PAD_STEP = 64


def padded_length(tokens: int) -> int:
    """The length a short pass of `tokens` tokens runs at through the seams (see `PAD_STEP`)."""
    if tokens <= PAD_STEP:
        return 1 << (tokens - 1).bit_length()
    return -(-tokens // PAD_STEP) * PAD_STEP


def seam_lengths(max_tokens: int) -> list[int]:
    """The padded lengths of passes of 1 to `max_tokens` tokens, shortest first."""
    return sorted({padded_length(n) for n in range(1, max_tokens + 1)})


class CompiledBlocks:
    """The compiled graphs of one model's short passes, owned by the engine that runs it.

    A compiled graph captures the modules as they were when traced, and the forward choices it
    was traced with, so the graphs are keyed by the registry's swap count (tuned-kernel patching
    and attaching fused kernels bump it) and the `ForwardChoices`; MLX traces each distinct set of
    input shapes once per graph. The owner drops it (and collects) before MLX shuts down: compiled
    graphs freed during interpreter exit may abort the process.
    """

    def __init__(self):
        self._graphs: dict[tuple, object] = {}
        self._steps: OrderedDict[tuple, Callable] = OrderedDict()
        self._seam_lengths: dict[tuple, set[int]] = {}  # pass lengths each set of seams was traced for
        # False: a shape not traced yet runs uncompiled rather than wait for a trace (an engine
        # that compiles its shapes ahead, warmup.py, turns it on only while it traces them).
        self.on_demand = True
        self.uncompiled_passes = 0  # short passes that ran uncompiled for that reason
        # Those passes by shape, ("step", (rows, rows_cap, t_cap)) or ("seams", length): what the
        # traffic asks for, which the warmer compiles first (warmup.py).
        self.missed: dict[tuple, int] = {}

    def _miss(self, shape: tuple) -> None:
        self.uncompiled_passes += 1
        self.missed[shape] = self.missed.get(shape, 0) + 1

    def _key(self, choices: ForwardChoices, key: tuple) -> tuple:
        return (swap_count(), choices) + key

    def _get(self, choices: ForwardChoices, key: tuple, make: Callable[[], object]):
        key = self._key(choices, key)
        graph = self._graphs.get(key)
        if graph is None:
            # Graphs of modules swapped out since are never used again: drop them.
            self._graphs = {k: v for k, v in self._graphs.items() if k[0] == key[0]}
            graph = self._graphs[key] = make()
        return graph

    def seams(self, layers: list, choices: ForwardChoices, length: int) -> list | None:
        """[project 0, finish 0 + project 1, …, finish L-1] for a pass of `length` tokens: one
        compiled call per layer boundary instead of two (a call costs ~20 µs of host time on a
        2-core x86 VM). None when not traced for that length and not `on_demand`."""
        key = self._key(choices, ("seams", id(layers)))
        traced = self._seam_lengths.setdefault(key, set())
        if length not in traced:
            if not self.on_demand:
                self._miss(("seams", length))
                return None
            traced.add(length)
        return self._get(choices, ("seams", id(layers)), lambda: _compile_seams(layers, choices))

    def step(self, model, attention: tuple, shape: tuple, choices: ForwardChoices) -> Callable | None:
        """The whole decode step of `model` (see `compile_step`) for one way of attending
        (`step_attention`) and one shape of the batch (rows, rows_cap, t_cap): one graph each,
        the STEP_GRAPHS most recently used kept (a daemon meets many shapes as agents come and
        go and their rows grow). None when not traced yet and not `on_demand`."""
        key = self._key(choices, (id(model), attention, shape))
        if key in self._steps:
            self._steps.move_to_end(key)
            return self._steps[key]
        if not self.on_demand:
            self._miss(("step", shape))
            return None
        for stale in [k for k in self._steps if k[0] != key[0]]:  # modules swapped out since
            del self._steps[stale]
        while len(self._steps) >= STEP_GRAPHS:
            self._steps.popitem(last=False)
        graph = self._steps[key] = compile_step(model, attention, choices)
        return graph


def _compile_seams(layers: list, choices: ForwardChoices) -> list:
    """Compiled (not yet traced) functions for each boundary between attention calls."""
    def first(h, positions):
        return project(layers[0], h, positions, choices=choices)

    def between(before, after):
        def seam(h, o, positions):
            h, x = finish(before, h, o, after.input_layernorm, choices)
            return (h, *project(after, h, positions, x, choices=choices))
        return seam

    def last(h, o):
        return finish(layers[-1], h, o, choices=choices)[0]

    inner = [between(a, b) for a, b in zip(layers[:-1], layers[1:])]
    return [mx.compile(f) for f in (first, *inner, last)]


def step_attention(model, plan, choices: ForwardChoices) -> tuple:
    """How a whole step attends, a key part of its graph: ("kernel", t_cap) where every layer
    has a decode attention kernel that may run (its split count follows t_cap, the most keys
    a row can hold), else ("mask", identity): MLX's attention over the whole capacity with
    each row's length masked, the rows read as a plain slice when they fill slots 0..B-1."""
    layers = model.model.layers
    attns = [layer.self_attn for layer in layers]
    if choices.fused and choices.decode_attention and all(
            getattr(a, "decode_attention", None) is not None for a in attns):
        return "kernel", plan.batch.t_cap
    return "mask", plan.slots is None


def compile_step(model, attention: tuple, choices: ForwardChoices) -> Callable:
    """One compiled decode step: (tokens (B,), positions (B,), the K/V scatter index (a tuple
    of three arrays), meta (2B,): each row's slot, then its key count after the write, and each
    layer's shared K/V array) -> (logits (B, vocab), each layer's K/V after the write)."""
    inner = model.model
    layers = inner.layers

    def step(tokens, positions, index, meta, *kvs):
        kvs, h, x = list(kvs), inner.embed_tokens(tokens), None
        rows, t_cap = tokens.shape[0], kvs[0].shape[2]
        # Rows in slots 0..B-1 read their keys as a slice, with one mask for every layer.
        mask = (mx.arange(t_cap)[None] < meta[rows:, None])[:, None, None, :] if attention == ("mask", True) else None
        for li, layer in enumerate(layers):
            # The head kernel may write K/V into the cache itself (kv None) only where the step's
            # one reader of the cache also takes q: the decode attention kernel. MLX's gather on
            # the masked path reads the cache apart from q, so nothing would order it after the write.
            into = (kvs[li], meta) if attention[0] == "kernel" else None
            q, kv = project(layer, h, positions, x, into=into, choices=choices)
            if kv is not None:
                kvs[li][index] = kv
            o = _attend(layer.self_attn, q, kvs[li], meta, attention, mask)
            # Every row samples: the model's final norm takes the last layer's residual add (a
            # kernel fold where the last down_proj verified one, as every other layer's norm).
            after = layers[li + 1].input_layernorm if li + 1 < len(layers) else inner.norm
            h, x = finish(layer, h, o, after, choices)
        return (lm_head(model, x), *kvs)

    return mx.compile(step)


def _attend(attn, q: mx.array, cache: mx.array, meta: mx.array, attention: tuple, mask) -> mx.array:
    """Each row's query (B, heads, 1, dim) against its own keys in the shared cache: (B, heads * dim)."""
    rows = q.shape[0]
    kernel = attention_kernel(attn, q) if attention[0] == "kernel" else None
    if kernel is not None:
        return kernel(q, cache, meta, attention[1], attn.scale)
    if mask is None:  # rows gathered from their slots (or a layer the kernel does not take): the kernel's contract
        return attention_reference(q, cache, meta, attn.scale, longest=cache.shape[2]).reshape(rows, -1)
    rows_cap = cache.shape[0] // 2
    keys, values = cache[:rows], cache[rows_cap:rows_cap + rows]
    return mx.fast.scaled_dot_product_attention(q, keys, values, scale=attn.scale, mask=mask).reshape(rows, -1)
