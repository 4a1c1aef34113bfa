"""Stretching a llama-family model's window past the length it was trained at, by RoPE scaling.

A `Stretch` names a scaling and the window it should cover; `stretched(args, stretch)` returns
the model's `llama.ModelArgs` with its rotary embedding changed (`rope_theta` or mlx-lm's
`rope_scaling`) and `max_position_embeddings` set to the window. Only how positions rotate q
and k changes, so the engine's forward, which calls each attention module's own `rope` with
every token's position, serves a stretched model as it is. benchmarks/long_window.py measures
the scalings; docs/long-window.md has the numbers behind the embedded model's choice.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from mlx_lm.models import llama

# "none": positions past the trained window rotate as they would have (the model never saw them);
# "linear": every position divided by the factor (position interpolation);
# "ntk": NTK-aware, a larger RoPE base, so low frequencies stretch by the factor and high ones
#   hardly move (a fixed base: the dynamic variant re-bases as the prompt grows, which a KV
#   cache kept across turns cannot follow);
# "yarn": YaRN (NTK-by-parts plus an attention temperature), mlx-lm's YarnRoPE;
# "parts": YaRN's NTK-by-parts alone: mlx-lm's YarnRoPE with the temperature cancelled
#   (mscale = mscale_all_dim), since the temperature changes the model on short prompts too.
SCALINGS = ("none", "linear", "ntk", "yarn", "parts")


@dataclass(frozen=True)
class Stretch:
    """A RoPE scaling and the window, in tokens, it makes the model serve."""

    scaling: str
    window: int

    def __post_init__(self):
        if self.scaling not in SCALINGS:
            raise ValueError(f"unknown RoPE scaling {self.scaling!r}; known: {', '.join(SCALINGS)}")


def stretched(args: llama.ModelArgs, stretch: Stretch) -> llama.ModelArgs:
    """`args` with the rotary embedding stretched from its trained window to `stretch.window`."""
    trained = args.max_position_embeddings
    factor = stretch.window / trained
    out = replace(args, max_position_embeddings=stretch.window)
    if stretch.scaling == "none" or factor <= 1:
        return out
    if stretch.scaling == "linear":
        return replace(out, rope_scaling={"type": "linear", "factor": factor})
    if stretch.scaling == "ntk":
        dims = args.head_dim or args.hidden_size // args.num_attention_heads
        return replace(out, rope_theta=args.rope_theta * factor ** (dims / (dims - 2)))
    parts = {"mscale": 1.0, "mscale_all_dim": 1.0} if stretch.scaling == "parts" else {}
    return replace(out, rope_scaling={"type": "yarn", "factor": factor,
                                      "original_max_position_embeddings": trained, **parts})
