"""Every CUDA kernel of ours compiles with NVRTC from the source cubin.py builds, on any machine.

The kernels' own launch code runs (templates, dtypes, shapes as the engine passes them) under
`compile_ahead`, which launches nothing: each kernel is compiled for an H200 (sm_90a). Skipped
where NVRTC or the CUDA headers are missing (the dev extras install both on Linux x86-64).
The launches themselves are checked against references on a GPU (test_kernels_cuda.py).
"""

from __future__ import annotations

import os

import mlx.core as mx
import pytest

from locals.engine.kernels import addnorm, cubin, decode_attention, headprep, jit, qmm
from locals.engine.kernels.reference import random_problem
from locals.engine.kernels.tuning import clock, tuner

NVRTC = cubin.find_nvrtc()
pytestmark = pytest.mark.skipif(NVRTC is None, reason="NVRTC or the CUDA headers are not installed")


@pytest.fixture
def h200_kernels(tmp_path, monkeypatch):
    """Our kernels built for an H200 (sm_90a), whatever this machine has, kept under tmp_path."""
    store = cubin.CubinStore(NVRTC, tmp_path)
    monkeypatch.setattr(jit, "_BUILT", {})
    monkeypatch.setattr(jit, "cuda_kernel", lambda name, source, header, inputs, outputs: cubin.CudaKernel(
        store, "sm_90a", name, source, header, inputs, outputs))
    return store


class NoCompiler(cubin.Nvrtc):
    def compile(self, source, name, arch):
        raise AssertionError("compiled again")


def _compiled(calls) -> set[str]:
    """The kernel functions `calls` compiled (all of them did, or the first failure is shown)."""
    outcome = cubin.compile_ahead(calls, workers=4)
    failures = [f"{name}: {why}" for name, why in outcome if why]
    assert not failures, failures[0]
    return {name for name, _ in outcome}


def test_quantized_matmul_kernels_compile(h200_kernels):
    x, w, scales, biases = random_problem(32, 256, 512, 4, 64, mx.bfloat16)
    res, nw = mx.zeros((32, 256), mx.bfloat16), mx.ones((256,), mx.bfloat16)
    eps, count = mx.array([1e-6], mx.float32), mx.zeros((1,), mx.uint32)
    vector = [qmm.QmvKernel("cuda", 4, 256), qmm.QmvKernel("cuda", 2, 256, staged=True),
              qmm.QmvKernel("cuda", 4, 128, split=True), qmm.QmvKernel("cuda", 16, 256, tensor=True, k_split=2)]
    calls = []
    for kernel in qmm.candidates("cuda") + vector:
        for rows in (1, 9, 17, 32):
            if not kernel.supports(rows, 4, 64, mx.bfloat16, mx.bfloat16):
                continue
            calls.append(lambda k=kernel, r=rows: k(x[:r], w, scales, biases, 64, 4))
            if kernel.takes_norm:
                calls.append(lambda k=kernel, r=rows: k(x[:r], w, scales, biases, 64, 4, gated=True))
                calls.append(lambda k=kernel, r=rows: k.add_norm(x[:r], res[:r], nw, eps, count, w, scales,
                                                                  biases, 64))
    xf, wf, sf, bf = random_problem(3, 256, 512, 8, 128, mx.float32)
    calls += [lambda k=k: k(xf, wf, sf, bf, 128, 8) for k in vector[:3]]
    names = _compiled(calls)
    assert {n.split("_")[1] for n in names} >= {"qmv", "qmvs", "qmvk", "qmma", "qmman", "ksum"}
    assert any("_float32_" in n for n in names) and any("_bfloat16_" in n for n in names)


def test_fused_layer_kernels_compile(h200_kernels):
    spec = headprep.HeadSpec(heads=4, kv_heads=2, head_dim=128, norm=True, eps=1e-6, traditional=False,
                             base=1e6, scale=1.0)
    calls = []
    for dtype in (mx.bfloat16, mx.float16, mx.float32):
        calls.append(lambda d=dtype: addnorm.check(addnorm.AddNorm("cuda", 640, 1e-6, d), 3))
        calls.append(lambda d=dtype: decode_attention.check(decode_attention.DecodeAttention("cuda", 4, 2, 128, d),
                                                             3, 200))
        calls.append(lambda d=dtype: headprep.check(headprep.HeadPrep("cuda", spec, d), 3, True))
        calls.append(lambda d=dtype: headprep.check_into_cache(headprep.HeadPrep("cuda", spec, d), 3, False))
    calls.append(lambda: clock.stamp(mx.zeros((1,))))
    names = "\n".join(_compiled(calls))
    for kernel in ("addnorm", "decode_attention_split", "decode_attention_combine", "headprep_array",
                   "headprep_cache", "stamp"):
        assert f"locals_{kernel}_" in names, kernel


def test_cubins_are_kept_on_disk_and_read_back(tmp_path):
    kernel = cubin.CudaKernel(cubin.CubinStore(NVRTC, tmp_path), "sm_90a", "locals_scale", "out[0] = x[0] * F;",
                              "", ["x"], ["out"])
    x = mx.zeros((4,), mx.float32)
    fn, first = kernel.cubin([x], [("F", 2)], [mx.float32])
    assert fn == "locals_scale_2" and [p.suffix for p in tmp_path.iterdir()] == [".cubin"]
    # A new process (a new store) reads the file instead of compiling: a broken compiler shows it.
    again = cubin.CudaKernel(cubin.CubinStore(NVRTC, tmp_path), "sm_90a", "locals_scale", "out[0] = x[0] * F;",
                             "", ["x"], ["out"])
    again.store.nvrtc = NoCompiler(NVRTC.library, NVRTC.include_dirs)
    kept = next(tmp_path.glob("*.cubin"))
    os.utime(kept, (1000, 1000))
    assert again.cubin([x], [("F", 2)], [mx.float32]) == (fn, first)
    assert kept.stat().st_mtime > 1000  # read: recently used, so trimmed last
    # Another template is another cubin.
    assert kernel.cubin([x], [("F", 3)], [mx.float32])[1] != first
    assert len(list(tmp_path.glob("*.cubin"))) == 2


def test_source_declares_inputs_outputs_constants_and_shapes():
    kernel = cubin.CudaKernel(None, "sm_90a", "locals_demo", "out[0] = T(a[a_shape[1]]);", "// helpers\n",
                              ["a", "b"], ["out"])
    fn, text = kernel.source([mx.zeros((2, 3), mx.bfloat16), mx.zeros((1,), mx.int32)],
                             [("T", mx.bfloat16), ("N", 4), ("ON", True)], [mx.float16])
    assert fn == "locals_demo_bfloat16_4_t"
    assert 'extern "C" __global__ void locals_demo_bfloat16_4_t(' in text
    assert "const __nv_bfloat16* a" in text and "const int32_t* b" in text and "__half* out" in text
    assert "using T = __nv_bfloat16;" in text and "constexpr int N = 4;" in text and "constexpr bool ON = true;" in text
    assert "const int a_shape[2] = {a_shape_0, a_shape_1};" in text and "b_shape" not in text
    assert text.index("// helpers") < text.index("extern")


def test_a_source_that_does_not_compile_says_why(tmp_path):
    kernel = cubin.CudaKernel(cubin.CubinStore(NVRTC, tmp_path), "sm_90a", "locals_bad", "out[0] = nope;", "",
                              ["x"], ["out"])
    x = mx.zeros((1,))
    with pytest.raises(RuntimeError, match="locals_bad did not compile:[\\s\\S]*nope"):
        kernel.cubin([x], [], [mx.float32])
    assert not list(tmp_path.iterdir())
    launch = dict(inputs=[x], template=[], grid=(1, 1, 1), threadgroup=(1, 1, 1), output_shapes=[(1,)],
                  output_dtypes=[mx.float32])

    def raises():
        raise ValueError("no such shape")

    (launch_1, why_1), (bad, why_bad) = cubin.compile_ahead([lambda: kernel(**launch), raises])
    assert (launch_1, why_1) == ("launch 1", "ValueError: no such shape")
    assert bad == "locals_bad" and "nope" in why_bad


def test_tuning_compiles_its_candidates_at_once(h200_kernels, monkeypatch):
    monkeypatch.setattr(tuner, "current_chip", lambda: ("cuda", "an H200"))
    said = []
    tuner.compile_candidates(tuner.default_candidates("cuda"), [(4, 64, "bfloat16")], [1, 8, 16, 17, 32], said.append)
    # Each tensor-core candidate compiles per row tile (8, 16, 32 rows: the wide ones only 32),
    # and the device clock's stamp for the problem's dtype and after a stamp.
    expected = 4 * 2 + 2 * 1 + 2
    assert said[0] == "compiling the candidates' kernels" and said[1].startswith(f"compiled {expected} kernels in ")
    assert len(list(h200_kernels.folder.glob("*.cubin"))) == expected


def test_a_kernel_nvrtc_cannot_compile_here_goes_to_mlx(tmp_path, caplog):
    # MLX builds its kernels with its own headers; where ours fail, MLX's JIT kernel runs the
    # same source (on this CPU-only MLX it says there is no CUDA back-end: it was asked).
    kernel = cubin.CudaKernel(cubin.CubinStore(NVRTC, tmp_path), "sm_90a", "locals_mlx_only",
                              "out[0] = mlx_only_helper(x[0]);", "", ["x"], ["out"])
    with pytest.raises(RuntimeError, match="CUDA back-end"):
        kernel(inputs=[mx.zeros((1,))], template=[], grid=(1, 1, 1), threadgroup=(1, 1, 1),
               output_shapes=[(1,)], output_dtypes=[mx.float32])
    assert "locals_mlx_only: NVRTC did not compile it here" in caplog.text
