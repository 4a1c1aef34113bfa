"""The kernels a loaded model gets before its engine runs, on GPUs: tuned small-batch matmuls
(kernels/registry.py), dense matmuls for wide passes on CUDA (on copies of the weights dequantized
here, where they fit), and the fused layer kernels
(kernels/fused.py). Each is an optimisation: a failure logs and leaves MLX's own ops."""

from __future__ import annotations

import logging

from locals.engine.forward.forward import supports_ragged

log = logging.getLogger(__name__)


def patch_kernels(loaded) -> tuple[int, int]:
    """On GPUs, route small-batch quantized matmuls to the tuned kernels (if `locals tune` ran on
    this chip), and on CUDA passes of many rows to dense matmuls: (layers tuned,
    layer shape x row count pairs still untuned). Tuning never runs inside the server: it held
    requests for seconds at a time (docs/tune.md)."""
    backend = getattr(loaded, "backend", None)
    if backend is None or getattr(backend, "kind", "cpu") == "cpu":
        return 0, 0
    try:
        from locals.engine.kernels import patch_model
        from locals.engine.kernels.registry import DENSE_ROWS, kept_copy_bytes, route_wide_passes
        from locals.engine.kernels.tuning.tuner import untuned

        patched, left = patch_model(loaded.model), untuned(loaded.model)
        if backend.kind == "cuda":
            route_wide_passes(loaded.model, backend.memory_bytes)  # prompt chunks: dense matmuls
            copies = kept_copy_bytes(loaded.model)
            if copies:
                log.info("kernels: passes of %d rows or more multiply dense copies of the weights (%.1f GB of "
                         "GPU memory)", DENSE_ROWS, copies / 1e9)
        if left:
            # Not a warning: served, a tuned table started later and held a lone agent's requests
            # (docs/tune.md, "What a tuned table costs, and gives, a served start").
            log.info("kernels: %d layer shape x row count pairs run MLX's own ops on this GPU; `locals tune` "
                     "times faster kernels for them (a few minutes; a tuned server starts later)", left)
        return patched, left
    except Exception:  # a missing or stale tuning table must never stop serving
        log.exception("tuned kernels not applied")
        return 0, 0


def fuse_kernels(loaded) -> dict[str, int]:
    """On GPUs, give ragged-forward models the fused kernels (q/k norm + RoPE, add + norm) that verify here."""
    kind = getattr(getattr(loaded, "backend", None), "kind", "cpu")
    if kind == "cpu" or not supports_ragged(loaded.model):
        return {}
    try:
        from locals.engine.kernels import fused
        from locals.engine.kernels.registry import modules_swapped

        attached = fused.attach(loaded.model, kind)
        if any(attached.values()):
            modules_swapped()  # compiled graphs traced without them
        return attached
    except Exception:  # an optimisation: MLX's own ops serve without them
        log.exception("fused kernels not applied")
        return {}
