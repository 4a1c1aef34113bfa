"""MLX's slowest CUDA kernels built ahead, all at once, in processes of their own.

MLX 0.32's CUDA quantized matmul compiles one CUTLASS module per row tile the first time a pass
needs it (`qmm_sm80_*_m16/m32/m64`: passes of 8-16, 17-32 and 33+ rows below the dense path's
registry.DENSE_ROWS or WIDE_ROWS), 35-50 s each with CUDA's runtime compiler on an H100, then keeps it on disk
(MLX_PTX_CACHE_DIR). The warm-up's passes met one tile; served passes of other row counts met the
other two after ready, each holding every stream for ~50 s (docs/benchmarks-log.md, "MLX's
quantized-matmul tiles, built ahead"). Compiled one after another in the warm-up they would add
~100 s to a machine's first start; here each tile is built by a short process of its own, all at
once, while the engine sets up, so a first start waits for about one. Later starts find the
modules on disk (a process then takes ~2 s). CUDA only: Metal's kernels ship compiled.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import mlx.core as mx
import mlx.nn as nn

from locals.engine.load.backend import compiled_kernel_folder

log = logging.getLogger(__name__)

# Rows of one pass through each tile MLX picks (min(64, max(16, next power of two of the rows))).
TILE_ROWS = (16, 32, 64)
# A module that has not built by then is left to the pass that needs it.
WAIT_S = 240.0
# MLX 0.32's file for one tile's module in its kernel folder. Under another name (another MLX, a
# GPU MLX builds other tiles for) the processes run at every start and find the modules in ~2 s.
MODULE_FILE = "qmm_sm80_tn_{dtype}_m{rows}_b{bits}_g{group}_affine.ptx"
# One quantized matmul at `rows` rows (argv: dtype, bits, group size, rows), evaluated: the
# module's name holds the dtype, tile, bits, group size and mode, not the layer's shape.
BUILD = """
import sys
import mlx.core as mx
dtype, bits, group, rows = getattr(mx, sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
k = 4 * max(64, group)
w, scales, biases = mx.quantize(mx.zeros((256, k), dtype), group_size=group, bits=bits)
mx.eval(mx.quantized_matmul(mx.zeros((rows, k), dtype), w, scales, biases, transpose=True,
                            group_size=group, bits=bits))
"""


def quantized_kinds(model) -> set[tuple[str, int, int]]:
    """(activation dtype, bits, group size) of the model's affine-quantized linear layers."""
    kinds = set()
    for _, module in model.named_modules():
        if isinstance(module, nn.QuantizedLinear) and getattr(module, "mode", "affine") == "affine":
            kinds.add((str(module.scales.dtype).removeprefix("mlx.core."), module.bits, module.group_size))
    return kinds


class Prebuild:
    """The building processes of one engine's start; `wait` before the passes that need them."""

    def __init__(self, kinds: set[tuple[str, int, int]]):
        self.began = time.perf_counter()
        self.processes = [subprocess.Popen([sys.executable, "-c", BUILD, dtype, str(bits), str(group), str(rows)],
                                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.PIPE)
                          for dtype, bits, group in sorted(kinds) for rows in TILE_ROWS]

    def wait(self, timeout_s: float = WAIT_S, stop=lambda: False) -> None:
        """Wait for every process, at most `timeout_s` from their start and no longer than `stop()`
        is false; one that fails or outlasts it is logged and left: the pass that needs its module
        builds it."""
        deadline = self.began + timeout_s
        while any(p.poll() is None for p in self.processes) and time.perf_counter() < deadline and not stop():
            time.sleep(0.05)
        late = [p for p in self.processes if p.poll() is None]
        for process in late:
            process.kill()
        if late and not stop():
            log.warning("MLX's quantized-matmul kernels took over %.0f s to build; passes build what is left",
                        timeout_s)
        for process in self.processes:
            _, err = process.communicate()
            if process.returncode and process not in late:
                log.warning("building MLX's quantized-matmul kernels ahead failed: %s",
                            err.decode(errors="replace").strip()[-400:])
        log.log(logging.INFO if time.perf_counter() - self.began >= 5 else logging.DEBUG,
                "MLX's quantized-matmul kernels ready (%d built or found at once) in %.1f s",
                len(self.processes), time.perf_counter() - self.began)
        self.processes = []


def start(model) -> Prebuild | None:
    """Start building the model's quantized-matmul tiles on CUDA; None elsewhere or with none to build."""
    if mx.default_device() != mx.gpu or not mx.cuda.is_available():
        return None
    folder = compiled_kernel_folder()
    return launch({kind for kind in quantized_kinds(model) if folder is None or not _on_disk(folder, *kind)})


def launch(kinds: set[tuple[str, int, int]]) -> Prebuild | None:
    """The processes building `kinds`' tiles; None with none to build or no process to be had."""
    if not kinds:
        return None
    try:
        return Prebuild(kinds)
    except OSError as exc:  # the passes build what they need, as before
        log.warning("cannot build MLX's quantized-matmul kernels ahead (%s); the passes that need them will", exc)
        return None


def _on_disk(folder, dtype: str, bits: int, group: int) -> bool:
    return all((folder / MODULE_FILE.format(dtype=dtype, rows=rows, bits=bits, group=group)).exists()
               for rows in TILE_ROWS)
