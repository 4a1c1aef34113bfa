"""Small-batch kernels: candidates, their plain-MLX references, verification and tuning.

The engine asks `registry.patch_model(model)` after load; layers whose problem has a
verified, faster kernel on this chip and MLX version use it, all others keep MLX's ops.
"""

from locals.engine.kernels.registry import mlx_ops_only, patch_model, tuned_linear

__all__ = ["mlx_ops_only", "patch_model", "tuned_linear"]
