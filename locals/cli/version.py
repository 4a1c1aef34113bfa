"""`locals --version`: the version and what this machine runs models on."""

from __future__ import annotations

from locals import __version__
from locals.cli.common import console


def print_version() -> None:
    """Print version, MLX version, backend, BLAS, device and memory."""
    from locals.cli.common import prepare_model_process

    prepare_model_process()
    from locals.engine.load.backend import detect, find_openblas, mlx_version

    b = detect()
    console.print(f"locals {__version__}")
    console.print(f"mlx {mlx_version()}, backend {b.kind}, device {b.device_name}, "
                  f"memory {b.memory_bytes / 1024**3:.1f} GiB")
    if b.kind == "cpu":
        hint = " (preloaded by locals)" if b.blas == "openblas" else ""
        if b.blas != "openblas" and not find_openblas():
            hint = " (install Debian's libopenblas0-pthread for ~10x faster CPU inference)"
        console.print(f"blas {b.blas}{hint}")
