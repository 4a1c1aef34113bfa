"""Engine tuning knobs (`EngineConfig`) and the helpers that derive defaults from the device.

No scheduling logic here: the scheduler, admission and caches read these values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import psutil

from locals import settings
from locals.engine.forward.choices import ForwardChoices


@dataclass
class EngineConfig:
    """How the engine batches: rows per step, tokens per step, memory for KV."""

    # Most sequences decoding at once; more wait for a slot.
    max_batch: int = settings.MAX_BATCH.default
    # Tokens one forward pass may carry (decode rows count 1 each); prompts are
    # read in chunks of what is left, so a long prompt never stalls the others for long.
    # 256 on a GPU, 64 on the CPU, where a step's time grows with its tokens: there 64 cut the
    # served token gaps of decoding rows beside prompt chunks (docs/benchmarks-log.md, "CPU: a
    # smaller step budget beside decoding rows").
    step_token_budget: int = field(default_factory=lambda: default_step_token_budget())
    # With no row decoding, prompts are read in chunks this many times the budget: bigger matmuls,
    # fewer steps (on a GPU 256-token chunks leave most of it idle: 8, 2,048-token chunks). On the
    # CPU 4 (256-token chunks): a chunk's softmax grows with its keys and the matmuls are as fast at
    # 256: a 2,048-token prompt read in 2,048-token chunks took 13 s, in 256-token chunks 7-8
    # (docs/benchmarks-log.md, "CPU: attention's softmax in numpy").
    solo_prefill_factor: int = field(default_factory=lambda: default_solo_prefill_factor())
    # Smallest prompt chunk per step, even when decode rows used up the budget, so
    # prefill always advances.
    min_prefill_chunk: int = 32
    # Bytes of KV the engine may hold (admission); None = half of `available_memory()` at start.
    kv_budget_bytes: int | None = None
    # Bytes the in-memory prefix cache may keep; 0 disables it; None = a quarter of
    # `available_memory()` at start (like the KV budget, after the kernels' weight copies exist).
    prefix_cache_bytes: int | None = None
    # Queue step n+1 before reading step n's tokens. Not on the CPU: there a step's attention is
    # evaluated while the step is built (forward/host_attention.py), so nothing would overlap and
    # step n's tokens would wait for step n+1.
    pipeline: bool = field(default_factory=lambda: default_pipeline())
    # With constrained rows whose next mask needs the token in flight, and that are writing
    # a value (no forced tokens for a while): queue the next forward pass before reading,
    # and mask its sampling after; False always reads first, then builds the whole step.
    pipeline_masks: bool = True
    # Prompt-lookup speculative decoding: rows whose recent tokens occur earlier in their
    # prompt or output propose up to `max_draft` tokens, verified in the same forward pass.
    speculate: bool = settings.SPECULATE.default
    max_draft: int = 16
    # Draft only while at most this many rows decode: past it the batch is compute-bound
    # and extra verified positions cost more than they save.
    speculate_max_rows: int = 8
    # Route small-batch quantized matmuls to this chip's tuned kernels (`locals tune`), and use the fused norm/RoPE/residual kernels that verify on it;
    # False patches and attaches nothing, so MLX's own ops run (on a model no other engine
    # patched: beside one that did, give it `kernels.mlx_ops_twin(model)`).
    tuned_kernels: bool = settings.KERNELS.default
    # Seconds the engine may spend compiling decode-step shapes before it takes requests; the
    # rest compile one at a time while no request is around (warmup.py). 0 (bare engines: tests,
    # benchmarks): compile on first use; served engines get `assemble.WARM_UP_S`.
    warm_up_s: float = 0.0
    # Join each layer's q/k/v and gate/up linears into one matmul each (fuse.py): three
    # kernels fewer per layer. False leaves the model's modules as loaded.
    fuse_projections: bool = True
    # Which attached kernels and compiled graphs the forward pass uses, up to how many tokens it
    # joins matmuls (forward/choices.py): benchmarks compare ways by building engines with others.
    forward: ForwardChoices = field(default_factory=ForwardChoices)

    def resolved_kv_budget(self) -> int:
        """The KV budget in bytes, deriving the default from free memory now."""
        if self.kv_budget_bytes is not None:
            return int(self.kv_budget_bytes)
        return int(available_memory() * 0.5)

    def resolved_prefix_cache_bytes(self) -> int:
        """The in-memory prefix cache's budget in bytes, deriving the default from free memory now."""
        if self.prefix_cache_bytes is not None:
            return int(self.prefix_cache_bytes)
        return default_prefix_cache_bytes()


def available_memory() -> int:
    """Bytes the engine's KV and prefix caches may be planned in: the system's available memory,
    and on CUDA no more than the GPU's memory MLX may use (95% of it) less what MLX holds now.
    There the host may have more memory than the card (an H100's 80 GB beside 128 GB), and
    caches sized from the host's outgrow the card: MLX then frees its cached buffers at each
    allocation that misses, and a request past the card's memory fails."""
    from locals.engine.load.backend import detect

    available = psutil.virtual_memory().available
    backend = detect()
    if backend.kind == "cuda":
        import mlx.core as mx

        available = min(available, int(backend.memory_bytes * 0.95) - mx.get_active_memory())
    return max(available, 0)


def default_prefix_cache_bytes() -> int:
    """A quarter of `available_memory()` (at least 256 MiB): one 16k-token prompt of a 4B model
    is ~2.4 GB of KV, and a budget below one entry keeps nothing."""
    return max(256 * 1024 * 1024, int(available_memory() * 0.25))


def default_pipeline() -> bool:
    """True but on the CPU (see `EngineConfig.pipeline`)."""
    from locals.engine.forward.host_attention import SOFTMAX_ON_HOST

    return not SOFTMAX_ON_HOST


def default_step_token_budget() -> int:
    """256 on a GPU, 64 on the CPU (see `EngineConfig.step_token_budget`)."""
    from locals.engine.load.backend import detect

    return 64 if detect().kind == "cpu" else 256


def default_solo_prefill_factor() -> int:
    """8 on a GPU, 4 on the CPU: 2,048- and 256-token chunks (see `EngineConfig.solo_prefill_factor`)."""
    from locals.engine.load.backend import detect

    return 4 if detect().kind == "cpu" else 8
