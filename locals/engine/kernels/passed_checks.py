"""Kernel checks that passed on this machine, kept on disk so that a later start skips them.

Every fused or tuned kernel is checked against the float32 reference before a model uses it
(`jit.remembered`): fresh random data, the truth computed on the CPU. A tuned H200 start set up
its kernels in 8.3 s against 2.1 without a table, the gated and folded kernels' checks being
the difference (docs/benchmarks-log.md, "Kernels kept on disk: a tuned table served"). A check
that passed is kept under a fingerprint of everything its answer depends on: the source files
of the kernel package (the kernels, their checks and tolerances), MLX's version, the device (its
name, architecture and, where MLX reports one, its uuid), the system (on a Mac, Metal's shader
compiler comes with it) and, on CUDA, the NVRTC that compiles the kernels and the driver. Any of
those changes, and every check runs again. A failure is never kept: it is checked again at the
next start (and logged again). Nothing is kept on the CPU, where no kernel of ours runs.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import platform
from pathlib import Path

import mlx.core as mx

from locals import disk_budget
from locals.atomic_file import write_atomically

log = logging.getLogger(__name__)

# Files of past fingerprints (an upgrade, another GPU) trimmed past this, least recently used first;
# one file holds a few dozen passes, a few KB.
DISK_CAP_BYTES = 1 << 20
DEVICE_KEYS = ("device_name", "architecture", "uuid", "compute_capability_major", "compute_capability_minor")


class PassedChecks:
    """The checks that passed under one fingerprint, in memory and in `folder`/<fingerprint>.json."""

    def __init__(self, folder: Path, fingerprint: str):
        self.path = folder / f"{fingerprint[:32]}.json"
        self.fingerprint = fingerprint
        self._passed = self._read()

    def _read(self) -> set[str]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):  # none yet, or unreadable: check everything again
            return set()
        if not isinstance(data, dict) or data.get("fingerprint") != self.fingerprint:
            return set()
        disk_budget.touch(self.path)
        return {key for key in data.get("passed", []) if isinstance(key, str)}

    def passed(self, key: str) -> bool:
        return key in self._passed

    def record(self, key: str) -> None:
        """Keep `key` as passed; a cache that cannot be written only costs the next start its checks."""
        if key in self._passed:
            return
        self._passed.add(key)
        body = json.dumps({"fingerprint": self.fingerprint, "passed": sorted(self._passed)}, indent=1)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(self.path, [body.encode()])
        except OSError as e:
            log.debug("could not keep %s: %s", self.path, e)


def fingerprint(sources: Path, mlx_version: str, device: dict, compiler: str) -> str:
    """A hash of the kernel package's source files under `sources`, MLX's version, the device's
    identity (`DEVICE_KEYS` of `mx.device_info()`) and the kernel compiler's version."""
    digest = hashlib.sha256()
    for path in sorted(sources.rglob("*.py")):
        digest.update(path.relative_to(sources).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    identity = {key: str(device[key]) for key in DEVICE_KEYS if key in device}
    digest.update(json.dumps([mlx_version, identity, compiler], sort_keys=True).encode())
    return digest.hexdigest()


_SHARED: list[PassedChecks | None] = []


def shared() -> PassedChecks | None:
    """This process's kept checks (None on the CPU), read once."""
    if not _SHARED:
        _SHARED.append(_open() if mx.default_device() == mx.gpu else None)
    return _SHARED[0]


def _open() -> PassedChecks | None:
    from locals.config import kernel_checks_dir
    from locals.engine.kernels import cubin

    compiler = platform.platform()  # the system: on a Mac, Metal's shader compiler comes with it
    if getattr(mx, "cuda", None) is not None and mx.cuda.is_available():
        store = cubin.shared_store()
        compiler += f"; nvrtc {store.nvrtc.version}" if store is not None else "; MLX's NVRTC"
        compiler += f"; driver {_cuda_driver_version()}"
    try:
        folder = kernel_checks_dir()
        disk_budget.trim(folder, "*.json", DISK_CAP_BYTES)
        return PassedChecks(folder, fingerprint(Path(__file__).parent, mx.__version__, dict(mx.device_info()),
                                                compiler))
    except OSError as e:  # no cache folder: check in every process
        log.debug("kernel checks not kept: %s", e)
        return None


def _cuda_driver_version() -> int:
    """The CUDA driver's version (12080 for 12.8), 0 where libcuda cannot say."""
    try:
        version = ctypes.c_int(0)
        ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version))
        return version.value
    except (OSError, AttributeError):
        return 0
