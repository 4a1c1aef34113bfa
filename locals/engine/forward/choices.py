"""How an engine's forward passes run: which attached kernels they may use, up to how many tokens
they join matmuls and run as compiled graphs. One frozen value per engine (`EngineConfig.forward`),
passed down to every pass; a benchmark that compares two ways builds two engines.

The defaults are what locals serves. Each field says what it turns off; what was measured for it
is in docs/benchmarks-log.md (the section named beside it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Passes of at most this many tokens (decode steps, short forced or draft chunks) run as compiled
# graphs: a small-batch decode step is host-bound on a GPU (building the ops in Python was a
# quarter of it), and compiling removes that work (docs/benchmarks-log.md, "Kernels of one engine
# step (ncu)"). A prompt chunk read beside decoding rows is device-bound: compiling those passes
# too (a limit of 256, the step budget) served the same on an H100 (docs/benchmarks-log.md,
# "Compiling the passes that read a prompt beside decoders"). On the CPU none: there the compiled
# steps decoded as fast as the eager ones at 64-token prompts and at half their rate at 1,024
# (8 rows: 31 against 58 tok/s; docs/benchmarks-log.md, "CPU: compiled steps"), and compiling
# ahead held requests behind traces.
COMPILE_MAX_TOKENS = 64
EVERY_PASS = 1 << 30  # a token limit no pass reaches


@dataclass(frozen=True)
class ForwardChoices:
    """The forward pass's options; every default on (see the module docstring)."""

    # Fused layer kernels where they are attached (verified on this GPU): q/k norm + RoPE, residual
    # add + norm (alone or inside o_proj/down_proj's tuned kernel) and decode attention. False runs
    # MLX's ops there, the tuned matmuls kept.
    fused: bool = True
    # The decode attention kernel among them; False attends with MLX's op.
    decode_attention: bool = True
    # In a whole decode step, the q/k kernel writes keys and values into the cache itself;
    # False stores them with a scatter a layer (docs/benchmarks-log.md, "Keys and values written by the
    # q/k kernel").
    cache_writes: bool = True
    # SwiGLU inside the joined gate/up kernel where it verified; False applies MLX's activation
    # (docs/benchmarks-log.md, "SwiGLU inside the gate/up kernel").
    gated: bool = True
    # A pure decode step as one compiled graph; False runs it as compiled seams between attention
    # calls (docs/benchmarks-log.md, "A decode step as one compiled graph").
    whole_steps: bool = True
    # Passes up to this many tokens run compiled (0: none; the CPU's default).
    compile_max_tokens: int = field(default_factory=lambda: default_compile_max_tokens())
    # Up to how many tokens a pass runs a layer's joined q/k/v and gate/up matmuls (forward/fuse.py);
    # longer passes run the parts, views of the same weights. Joined won at every batch size with the
    # fused q/k kernel (docs/benchmarks-log.md, "Fused layer kernels, joined every pass"); without it see
    # layer_pass.UNFUSED_QKV_MAX_TOKENS.
    joined_qkv_max_tokens: int = EVERY_PASS
    joined_gate_up_max_tokens: int = EVERY_PASS


def default_compile_max_tokens() -> int:
    """`COMPILE_MAX_TOKENS` on a GPU, 0 on the CPU (see there)."""
    from locals.engine.load.backend import detect

    return 0 if detect().kind == "cpu" else COMPILE_MAX_TOKENS
