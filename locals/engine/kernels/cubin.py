"""Our CUDA kernels compiled by us, kept on disk as cubins, and launched precompiled.

MLX 0.32's `mx.fast.cuda_kernel` compiles every template instantiation with NVRTC in every new
process (its disk cache is off for custom kernels): ~2 s a graph holding one on an H200, paid at
each start and by each tuning candidate (docs/benchmarks-log.md, "A tuned table served"). Here a
kernel's whole source is built as MLX builds it (pointer arguments for the inputs, then the
outputs, the template's constants first in the body), compiled by the NVRTC library MLX itself
uses, kept under MLX's kernel folder by the hash of what went into it, and launched with
`mx.fast.precompiled_cuda_kernel`. An input whose `<name>_shape` the source reads gets its shape
as int arguments after the outputs, gathered into a `<name>_shape` array at the body's start.

`CudaKernel` is called as MLX's kernel objects are; `source()`, `cubin()` and `compile_ahead` need no
GPU, so the tests compile every kernel's source on any machine with NVRTC and the CUDA headers.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import logging
import os
import site
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import mlx.core as mx

from locals import disk_budget, settings
from locals.atomic_file import write_atomically

log = logging.getLogger(__name__)

# The cubins kept, least recently used out past this (at a process's first kernel): ~20 KB each
# (the kernel tests' 118 take 2.3 MB), a few hundred a `locals tune`, a new set when a kernel's
# source changes with an upgrade. `locals cache clear --kernels` empties the folder.
DISK_CAP_BYTES = 256 << 20

CUDA_TYPES = {
    mx.bool_: "bool", mx.int8: "int8_t", mx.int16: "int16_t", mx.int32: "int32_t", mx.int64: "int64_t",
    mx.uint8: "uint8_t", mx.uint16: "uint16_t", mx.uint32: "uint32_t", mx.uint64: "uint64_t",
    mx.float16: "__half", mx.bfloat16: "__nv_bfloat16", mx.float32: "float",
}
# NVRTC knows no <cstdint> or <cmath> without CCCL's headers (which only MLX's CUDA wheels carry):
# the fixed widths here are glibc's on LP64 Linux.
PRELUDE = """#include <cuda_bf16.h>
#include <cuda_fp16.h>
typedef signed char int8_t; typedef short int16_t; typedef int int32_t; typedef long int64_t;
typedef unsigned char uint8_t; typedef unsigned short uint16_t; typedef unsigned int uint32_t;
typedef unsigned long uint64_t;
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

"""
# The nvidia wheels' folder for CUDA 13 (mlx[cuda13] depends on them), then CUDA 12's names.
WHEEL_DIRS = ("cu13", "cuda_runtime", "cuda_nvrtc")


def template_suffix(template: Sequence[tuple[str, object]]) -> str:
    """What the template adds to a kernel's name, as MLX spells it (`_4`, `_t`, `_bfloat16`)."""
    def one(value) -> str:
        if isinstance(value, bool):
            return "t" if value else "f"
        if isinstance(value, int):
            return str(value)
        return str(value).removeprefix("mlx.core.")
    return "".join(f"_{one(value)}" for _, value in template)


def constant_line(name: str, value) -> str:
    if isinstance(value, bool):
        return f"  constexpr bool {name} = {'true' if value else 'false'};\n"
    if isinstance(value, int):
        return f"  constexpr int {name} = {value};\n"
    return f"  using {name} = {CUDA_TYPES[value]};\n"


class Nvrtc:
    """The NVRTC library (the one MLX loaded where it did) and the CUDA headers it compiles with."""

    def __init__(self, library: str, include_dirs: list[Path]):
        self.library, self.lib = library, ctypes.CDLL(library)
        self.include_dirs = include_dirs
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        self.version = f"{major.value}.{minor.value}"

    def _check(self, code: int, what: str) -> None:
        if code != 0:
            self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            raise RuntimeError(f"{what} failed: {self.lib.nvrtcGetErrorString(code).decode()}")

    def options(self, arch: str) -> list[str]:
        return [f"--gpu-architecture={arch}", "--device-as-default-execution-space", "--std=c++17",
                *(f"--include-path={d}" for d in self.include_dirs)]

    def compile(self, source: str, name: str, arch: str) -> bytes:
        """The cubin of `source` for `arch` (e.g. "sm_90a"); RuntimeError with NVRTC's log if it fails."""
        prog = ctypes.c_void_p()
        self._check(self.lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), f"{name}.cu".encode(),
                                                0, None, None), "nvrtcCreateProgram")
        try:
            opts = [o.encode() for o in self.options(arch)]
            code = self.lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
            if code != 0:
                size = ctypes.c_size_t()
                self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
                text = ctypes.create_string_buffer(size.value)
                self.lib.nvrtcGetProgramLog(prog, text)
                raise RuntimeError(f"{name} did not compile:\n{text.value.decode(errors='replace')}")
            size = ctypes.c_size_t()
            self._check(self.lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
            out = ctypes.create_string_buffer(size.value)
            self._check(self.lib.nvrtcGetCUBIN(prog, out), "nvrtcGetCUBIN")
            return out.raw
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _site_dirs() -> list[Path]:
    dirs = [*site.getsitepackages(), site.getusersitepackages(), *sys.path]
    return [Path(d) for d in dict.fromkeys(dirs) if d and Path(d).is_dir()]


def _loaded_nvrtc() -> str | None:
    """The NVRTC library already mapped into this process (MLX's CUDA build links it)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if "/libnvrtc.so" in path:
                    return path
    except OSError:
        pass
    return None


def find_nvrtc() -> Nvrtc | None:
    """NVRTC and the CUDA headers as MLX finds them (its wheels' nvidia folders, CUDA_HOME or
    CUDA_PATH, /usr/local/cuda), or None where either is missing."""
    wheels = [site / "nvidia" / name for site in _site_dirs() for name in WHEEL_DIRS]
    toolkits = [Path(p) for p in (settings.foreign("CUDA_HOME"), settings.foreign("CUDA_PATH"), "/usr/local/cuda") if p]
    library = _loaded_nvrtc() or next(
        (str(lib) for d in wheels + toolkits for lib in sorted((d / "lib").glob("libnvrtc.so*"), reverse=True)
         if "builtins" not in lib.name), None) or ctypes.util.find_library("nvrtc")
    mlx_include = Path(mx.__file__).parent / "include"
    includes = [d for d in (mlx_include, mlx_include / "cccl", *(w / "include" for w in wheels),
                            *(t / "include" for t in toolkits)) if d.is_dir()]
    if library is None or not any((d / "cuda_bf16.h").exists() for d in includes):
        return None
    return Nvrtc(library, includes)


def device_arch() -> str:
    """NVRTC's name for this GPU's SASS, as MLX compiles for it (`sm_90a` on an H200)."""
    info = mx.device_info()
    major, minor = int(info["compute_capability_major"]), int(info["compute_capability_minor"])
    return f"sm_{major}{minor}{'a' if major >= 9 else ''}"


class CubinStore:
    """Cubins by the hash of (source, NVRTC version, options): in this process, then in `folder`."""

    def __init__(self, nvrtc: Nvrtc, folder: Path | None):
        self.nvrtc, self.folder = nvrtc, folder
        self._memory: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def get(self, source: str, name: str, arch: str) -> bytes:
        key = hashlib.sha256("\0".join([source, self.nvrtc.version, *self.nvrtc.options(arch)]).encode()).hexdigest()
        if (cubin := self._memory.get(key)) is not None:
            return cubin
        path = self.folder / f"{name[:48]}-{key[:20]}.cubin" if self.folder else None
        if path is not None and path.is_file():
            cubin = path.read_bytes()
            disk_budget.touch(path)  # recently used: trimmed last
        else:
            cubin = self.nvrtc.compile(source, name, arch)
            if path is not None:
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    write_atomically(path, [cubin])
                except OSError as e:  # a read-only cache only costs the next start a compile
                    log.debug("could not keep %s: %s", path, e)
        with self._lock:
            self._memory[key] = cubin
        return cubin


_SHARED: list[CubinStore | None] = []
_COLLECTING = threading.local()


def compile_ahead(launches: Iterable[Callable[[], object]], workers: int | None = None) -> list[tuple[str, str]]:
    """Compile (or read) the cubins `launches` (calls of our kernels) need, several at once.

    The launches run on this thread with nothing launched: each kernel call notes its source and
    returns zeros of its outputs' shapes. Then NVRTC compiles the sources in a thread pool (it runs
    outside the GIL and touches no MLX state), so a cold machine's compiles take the time of one per
    core. Returns (kernel function, "" or why it failed) for each cubin, and ("launch N", why) for
    each launch that raised; the real launch's own check reports a failure again.
    """
    jobs: dict[tuple, tuple[CudaKernel, tuple, str, str]] = {}
    outcome: list[tuple[str, str]] = []
    _COLLECTING.jobs = jobs
    try:
        for i, launch in enumerate(launches):
            try:
                launch()
            except Exception as e:  # noqa: BLE001 - reported, not fatal: the real launch decides
                outcome.append((f"launch {i}", f"{type(e).__name__}: {e}"))
    finally:
        _COLLECTING.jobs = None

    def one(job) -> tuple[str, str]:
        kernel, key, fn, text = job
        try:
            kernel._built[key] = (fn, kernel.store.get(text, fn, kernel.arch))
            return fn, ""
        except RuntimeError as e:
            return fn, str(e)

    with ThreadPoolExecutor(workers or min(16, os.cpu_count() or 1)) as pool:
        return outcome + list(pool.map(one, jobs.values()))


def shared_store() -> CubinStore | None:
    """This process's store, kept in the compiled-kernel folder; None (said once) without NVRTC."""
    if not _SHARED:
        from locals.engine.load.backend import compiled_kernel_folder

        nvrtc = find_nvrtc()
        if nvrtc is None:
            log.info("NVRTC or the CUDA headers not found: MLX compiles locals' CUDA kernels in each process")
        folder = compiled_kernel_folder()
        ours = folder / "locals" if folder else None
        if ours is not None:
            disk_budget.trim(ours, "*.cubin", DISK_CAP_BYTES)
        _SHARED.append(CubinStore(nvrtc, ours) if nvrtc else None)
    return _SHARED[0]


class CudaKernel:
    """One kernel of ours on CUDA, called as `mx.fast.cuda_kernel`'s objects are."""

    def __init__(self, store: CubinStore, arch: str, name: str, source: str, header: str,
                 input_names: list[str], output_names: list[str]):
        self.store, self.arch, self.name = store, arch, name
        self.body, self.header = source, header
        self.input_names, self.output_names = input_names, output_names
        self.shaped = [f"{n}_shape" in source for n in input_names]
        self._built: dict[tuple, tuple[str, bytes]] = {}
        self._fallback = None  # MLX's kernel, once one of our compiles failed

    def source(self, inputs: Sequence[mx.array], template: Sequence[tuple[str, object]],
               output_dtypes: Sequence[mx.Dtype]) -> tuple[str, str]:
        """(the kernel's function name, its whole source) for these inputs, template and outputs."""
        fn = f"{self.name}{template_suffix(template)}"
        params = [f"const {CUDA_TYPES[a.dtype]}* {n}" for n, a in zip(self.input_names, inputs)]
        params += [f"{CUDA_TYPES[d]}* {n}" for n, d in zip(self.output_names, output_dtypes)]
        shapes = ""
        for n, a, shaped in zip(self.input_names, inputs, self.shaped):
            if shaped and a.ndim:  # as MLX: a 0-d input has no shape to pass
                dims = [f"{n}_shape_{i}" for i in range(a.ndim)]
                params += [f"const int {d}" for d in dims]
                shapes += f"  const int {n}_shape[{a.ndim}] = {{{', '.join(dims)}}};\n"
        constants = "".join(constant_line(k, v) for k, v in template)
        joined = ",\n    ".join(params)
        text = (f"{PRELUDE}{self.header}\nextern \"C\" __global__ void {fn}(\n    {joined}) {{\n"
                f"{constants}{shapes}\n{self.body}\n}}\n")
        return fn, text

    def _use_mlx(self, why: Exception) -> None:
        """Launch this kernel with MLX's own JIT kernel for the same source from now on, and say so."""
        log.warning("%s: NVRTC did not compile it here (%s); MLX compiles it instead, in every process",
                    self.name, str(why).splitlines()[0])
        self._fallback = mx.fast.cuda_kernel(name=self.name, source=self.body, header=self.header,
                                             input_names=self.input_names, output_names=self.output_names)

    def _key(self, inputs, template, output_dtypes) -> tuple:
        return (tuple(template), tuple((a.dtype, a.ndim if s else 0) for a, s in zip(inputs, self.shaped)),
                tuple(output_dtypes))

    def cubin(self, inputs, template, output_dtypes) -> tuple[str, bytes]:
        """(function name, cubin) for these inputs, template and outputs: built once per process."""
        key = self._key(inputs, template, output_dtypes)
        if key not in self._built:
            fn, text = self.source(inputs, template, output_dtypes)
            self._built[key] = (fn, self.store.get(text, fn, self.arch))
        return self._built[key]

    def __call__(self, *, inputs: list, template: list, grid: tuple, threadgroup: tuple,
                 output_shapes: list, output_dtypes: list, init_value: float | None = None,
                 stream=None) -> list[mx.array]:
        if (jobs := getattr(_COLLECTING, "jobs", None)) is not None:  # compile_ahead
            key = self._key(inputs, template, output_dtypes)
            if key not in self._built:
                jobs[(id(self), key)] = (self, key, *self.source(inputs, template, output_dtypes))
            return [mx.zeros(shape, dtype=dtype) for shape, dtype in zip(output_shapes, output_dtypes)]
        if self._fallback is None:
            try:
                fn, cubin = self.cubin(inputs, template, output_dtypes)
            except RuntimeError as e:  # where MLX's compile may not fail (its own headers): MLX from now on
                self._use_mlx(e)
        if self._fallback is not None:
            return self._fallback(inputs=inputs, template=template, grid=grid, threadgroup=threadgroup,
                                  output_shapes=output_shapes, output_dtypes=output_dtypes, init_value=init_value,
                                  stream=stream)
        shapes = [dim for a, shaped in zip(inputs, self.shaped) if shaped for dim in a.shape]
        return mx.fast.precompiled_cuda_kernel(
            name=fn, compiled_source=cubin, inputs=inputs, output_shapes=output_shapes,
            output_dtypes=output_dtypes, scalars=shapes, grid=grid, threadgroup=threadgroup,
            init_value=init_value, ensure_row_contiguous=True, stream=stream)
