"""The CUDA small-batch kernels against their references, on the GPU only (skipped elsewhere)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest

from locals.engine.kernels import qmm
from locals.engine.kernels.registry import TunedQuantizedLinear, patch_model
from locals.engine.kernels.tuning import MLX_OP, TuningTable, current_chip, kernels_tag, model_problems
from locals.engine.kernels.verify import default_cases, passes, verify

pytestmark = pytest.mark.skipif(not (hasattr(mx, "cuda") and mx.cuda.is_available()),
                                reason="the CUDA kernels run only where MLX has a CUDA device")

OTHER_QUANTS = [(8, 64, mx.bfloat16), (4, 32, mx.float16), (8, 128, mx.float32), (4, 128, mx.float32)]
# Every launch configuration on the common 4-bit case; each kernel source on every other
# quantization (launch configurations share one source, so this covers the code paths
# while keeping the number of JIT compiles, ~1 s each, down).
MATRIX = ([(k, 4, 64, mx.bfloat16) for k in qmm.candidates("cuda")]
          + [(k, *q) for k in (qmm.QmvKernel("cuda", 4, 256), qmm.QmvKernel("cuda", 2, 256, staged=True))
             for q in OTHER_QUANTS]
          # The tensor-core kernel takes 4-bit fp16/bf16 only.
          + [(qmm.QmvKernel("cuda", 32, 256, tensor=True, unroll=2), 4, g, d)
             for g, d in ((32, mx.float16), (128, mx.bfloat16), (64, mx.float16))])


def _id(item):
    kernel, bits, group, dtype = item
    return f"{kernel.name}-q{bits}-g{group}-{str(dtype).rsplit('.', 1)[-1]}"


@pytest.mark.parametrize("item", MATRIX, ids=_id)
def test_cuda_candidate_matches_reference(item):
    kernel, bits, group, dtype = item
    verdicts = verify(kernel, default_cases(bits, group, dtype), stop_at_first_failure=False)
    assert passes(verdicts), [f"{v.case.describe()}: {v.reason}" for v in verdicts if not v.ok]
    assert len(verdicts) == len(default_cases(bits, group, dtype))


def test_kernel_asking_too_much_of_the_chip_is_rejected_not_fatal():
    # 4 columns x 16 rows of float accumulators per thread in 512-thread blocks exceed the
    # register file on an H200: the launch fails, and the verifier says so instead of crashing.
    verdicts = verify(qmm.QmvKernel("cuda", 4, 512, staged=True), default_cases(4, 64, mx.bfloat16))
    assert not passes(verdicts)
    assert "raised" in verdicts[-1].reason


def _mlp(dims, dtype=mx.bfloat16):
    mx.random.seed(3)
    model = nn.Sequential(nn.Linear(dims[0], dims[1], bias=False), nn.Linear(dims[1], dims[2], bias=True))
    model.set_dtype(dtype)
    nn.quantize(model, group_size=64, bits=4)
    return model


def test_patched_model_uses_cuda_kernel_and_matches():
    model = _mlp((320, 960, 320))
    kind, chip = current_chip()
    kernel = qmm.candidates("cuda")[0]
    table = TuningTable(chip=chip, mlx=mx.__version__, kernels=kernels_tag(kind), complete=True,
                        choices={p.key: {str(m): kernel.name for m in range(1, 9)} for p in model_problems(model)})
    x = mx.random.normal((2, 3, 320)).astype(mx.bfloat16)  # 6 rows through (B, L, K)
    expected = model(x)
    assert patch_model(model, table) == 2
    assert all(isinstance(layer, TunedQuantizedLinear) for layer in model.layers)
    got = model(x)
    err = (mx.abs(got.astype(mx.float32) - expected.astype(mx.float32)).max() / mx.abs(expected).max()).item()
    assert err < 2e-2
    wide = mx.random.normal((20, 320)).astype(mx.bfloat16)  # 20 rows: not tuned, MLX's op
    assert table.choice(model_problems(model)[0].key, 20) == MLX_OP
    assert mx.array_equal(model.layers[0](wide), nn.QuantizedLinear.__call__(model.layers[0], wide))
