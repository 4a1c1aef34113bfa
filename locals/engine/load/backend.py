"""Which device MLX runs on, how much memory it has, and the CPU's BLAS.

On Linux's CPU backend MLX's bundled reference BLAS is ~40x slower than OpenBLAS
(1.8 vs ~80 GFLOP/s for a 1024² matmul), so when Debian's OpenBLAS is installed and
not loaded, `reexec_with_fast_blas` restarts the process with it preloaded.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil

from locals import settings

OPENBLAS_CANDIDATES = [
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3",
]
_REEXEC_FLAG = settings.BLAS_REEXEC.name


@dataclass
class Backend:
    """The device MLX computes on, its memory in bytes, and (on CPU) the BLAS in use."""

    kind: str  # "metal" | "cuda" | "cpu"
    memory_bytes: int
    device_name: str
    blas: str = ""

    @property
    def dense_weights(self) -> bool:
        """CPU runs dequantized float32 weights (MLX's CPU quantized matmul is slow)."""
        return self.kind == "cpu"


def find_openblas() -> str | None:
    """Path of Debian's OpenBLAS libblas, if installed."""
    return next((p for p in OPENBLAS_CANDIDATES if Path(p).exists()), None)


def blas_in_use() -> str:
    """'openblas' when OpenBLAS is preloaded into this process, else MLX's bundled one."""
    if sys.platform == "darwin":
        return "accelerate"
    preload = settings.foreign("LD_PRELOAD", "")
    return "openblas" if "openblas" in preload else "reference (bundled)"


def detect() -> Backend:
    """Probe MLX for Metal or CUDA; otherwise the CPU with system memory."""
    import mlx.core as mx

    if mx.metal.is_available():
        info = mx.device_info()
        mem = int(info.get("memory_size", psutil.virtual_memory().total))
        return Backend("metal", mem, str(info.get("device_name", "Apple GPU")), "accelerate")
    cuda = getattr(mx, "cuda", None)
    if cuda is not None and cuda.is_available():
        info = mx.device_info()  # on CUDA the card's own memory is "total_memory"
        mem = int(info.get("total_memory", 0) or info.get("memory_size", 0) or psutil.virtual_memory().total)
        return Backend("cuda", mem, str(info.get("device_name", "NVIDIA GPU")))
    return Backend("cpu", psutil.virtual_memory().total, platform.processor() or platform.machine(),
                   blas_in_use())


def mlx_version() -> str:
    """The installed MLX version."""
    import mlx.core as mx

    return mx.__version__


def keep_compiled_kernels() -> None:
    """Keep MLX's compiled CUDA kernels under locals' cache, per MLX version.

    MLX's default is a temp dir that a reboot empties, and compiling kernels with CUDA's
    runtime compiler takes seconds each. MLX keeps its own JIT kernels there, never custom
    ones, so locals keeps its kernels' cubins in the same folder (kernels/cubin.py).
    A user's own MLX_PTX_CACHE_DIR wins. MLX reads it at its first kernel compile: call
    this before.
    """
    if settings.foreign("MLX_PTX_CACHE_DIR"):
        return
    if (folder := compiled_kernel_folder()) is not None:
        os.environ["MLX_PTX_CACHE_DIR"] = str(folder)  # MLX reads it from this process's environment


# MLX encodes a stream's kernels into CUDA graphs (chains of up to 100 kernels on an H100 or
# H200), instantiating one for each chain it has not met and updating a cached one otherwise.
# Served, passes beside prompt chunks meet new chains all the time, and instantiating them was
# the long gaps (80-280 ms of MLX queuing one pass). Launched one by one instead, 8 agents on an
# H200 saw a token gap p99 of 30-40 ms against 36-48 (lower in 5 of 5 paired rounds), long gaps
# fell from 11 to 4, bursts ran 8% faster and the wait was the same (docs/benchmarks-log.md,
# "CUDA graphs off, served; 1, 8 and 16 agents on an H200"); in one process, at one shape, graphs had been 2-7% faster.
CUDA_GRAPHS = "0"
# Where a user turns graphs back on, MLX keeps this many instead of 400: evicting and instantiating
# them again took 11% of the engine thread served to 16 agents on an H200 (docs/benchmarks-log.md,
# "An H100 table shipped; 1, 8 and 16 agents served").
CUDA_GRAPH_CACHE = 4096


def cuda_launch_settings(graphs: bool = False) -> None:
    """MLX launches CUDA kernels one by one (CUDA_GRAPHS; in graphs with `graphs`, as `locals tune`
    times them), and keeps CUDA_GRAPH_CACHE graphs where they are on. A user's settings win, and
    so does an earlier call's. MLX reads both when a stream first queues work: call this before any."""
    if not settings.foreign("MLX_USE_CUDA_GRAPHS"):
        os.environ["MLX_USE_CUDA_GRAPHS"] = "1" if graphs else CUDA_GRAPHS
    if not settings.foreign("MLX_CUDA_GRAPH_CACHE_SIZE"):
        os.environ["MLX_CUDA_GRAPH_CACHE_SIZE"] = str(CUDA_GRAPH_CACHE)


def compiled_kernel_folder() -> Path | None:
    """Where compiled CUDA kernels are kept: MLX_PTX_CACHE_DIR, else locals' cache per MLX version
    (None without a cache folder)."""
    if chosen := settings.foreign("MLX_PTX_CACHE_DIR"):
        return Path(chosen)
    from locals.config import kernels_dir

    try:
        return kernels_dir() / mlx_version()
    except OSError:  # no writable cache folder: MLX's default is as good as nothing
        return None


def needs_fast_blas_reexec() -> bool:
    """True on Linux when OpenBLAS is installed, not yet preloaded, and re-exec is allowed."""
    if sys.platform != "linux" or settings.BLAS_REEXEC.get() or settings.NO_OPENBLAS.get():
        return False
    return find_openblas() is not None and "openblas" not in settings.foreign("LD_PRELOAD", "")


def reexec_with_fast_blas(argv: list[str] | None = None) -> None:
    """On Linux, restart this process with OpenBLAS preloaded when it is installed but not loaded.

    Does nothing on macOS, when already preloaded, when OpenBLAS is absent, when
    LOCALS_NO_OPENBLAS is set, or if a previous re-exec already happened.
    """
    if not needs_fast_blas_reexec():
        return
    lib = find_openblas()
    env = dict(os.environ)
    env["LD_PRELOAD"] = ":".join(p for p in (lib, env.get("LD_PRELOAD", "")) if p)
    env[_REEXEC_FLAG] = "1"
    args = argv if argv is not None else [sys.executable, *sys.orig_argv[1:]]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(args[0], args, env)


def release_memory() -> None:
    """Give freed memory back: MLX's buffer cache, and on Linux glibc's free lists.

    Measured on the CPU backend after 64 requests: RSS 3.1 GB with 0.8 GB live; glibc kept
    the rest until `malloc_trim(0)` returned it (0.95 GB after).
    """
    import ctypes

    import mlx.core as mx

    mx.clear_cache()
    if sys.platform == "linux":
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc (e.g. musl): nothing to trim
            pass
