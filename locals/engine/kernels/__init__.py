"""Small-batch kernels: candidates, their plain-MLX references, verification and tuning.

The engine asks `registry.patch_model(model)` after load; layers whose problem has a
verified, faster kernel on this chip and MLX version use it, all others keep MLX's ops.
"""

from locals.engine.kernels.registry import patch_model, tuned_linear

__all__ = ["patch_model", "tuned_linear"]
