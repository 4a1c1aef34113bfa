"""Small-batch kernels: candidates, their plain-MLX references, verification and tuning.

The engine asks `registry.patch_model(model)` after load; layers whose problem has a
verified, faster kernel on this chip and MLX version use it, all others keep MLX's ops.
`twin.mlx_ops_twin(model)` gives what must run MLX's ops beside it the same weights.
"""

from locals.engine.kernels.registry import patch_model
from locals.engine.kernels.twin import mlx_ops_twin

__all__ = ["mlx_ops_twin", "patch_model"]
