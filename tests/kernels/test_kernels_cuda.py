"""The CUDA small-batch kernels against their references, on the GPU only (skipped elsewhere)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest

from locals.engine.kernels import addnorm, decode_attention, fused, headprep, qmm
from locals.engine.kernels.registry import TunedQuantizedLinear, patch_model
from locals.engine.kernels.tuning.tuner import MLX_OP, TuningTable, current_chip, kernels_tag, model_problems
from locals.engine.kernels.tuning.verify import default_cases, passes, verify

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
    cases = default_cases(bits, group, dtype)
    verdicts = verify(kernel, cases, stop_at_first_failure=False)
    assert passes(verdicts), [f"{v.case.describe()}: {v.reason}" for v in verdicts if not v.ok]
    # Every case of a row count the kernel takes ran (1-16 rows, or 17-32 for the wide ones).
    assert len(verdicts) == sum(kernel.supports(c.rows, bits, group, dtype, dtype) for c in cases) >= 4


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


HEAD_SPECS = [
    # Qwen3-4B: q/k norms, 32 query and 8 key/value heads of 128.
    (headprep.HeadSpec(32, 8, 128, True, 1e-6, False, 1e6, 1.0), (mx.bfloat16, mx.float16, mx.float32)),
    # SmolLM2-like: no norms, heads of 64 (one warp a head), odd head counts.
    (headprep.HeadSpec(9, 3, 64, False, 0.0, False, 1e4, 1.0), (mx.bfloat16,)),
    # Traditional pairs, heads of 256 (four warps a head), a RoPE scale.
    (headprep.HeadSpec(4, 2, 256, True, 1e-5, True, 1e4, 0.5), (mx.float16,)),
]


@pytest.mark.parametrize("spec,dtype", [(s, d) for s, ds in HEAD_SPECS for d in ds],
                         ids=lambda v: str(v).rsplit(".", 1)[-1] if isinstance(v, mx.Dtype) else f"d{v.head_dim}")
def test_cuda_head_prep_matches_reference(spec, dtype):
    prep = headprep.HeadPrep("cuda", spec, dtype)
    assert headprep.verified(prep) == ""
    # Its keys and values written straight into a decode batch's cache: the whole cache compared.
    assert headprep.cache_verified(prep) == ""


@pytest.mark.parametrize("heads,kv_heads,dim,dtype", [(32, 8, 128, mx.bfloat16), (9, 3, 64, mx.float16),
                                                      (4, 4, 256, mx.float32), (15, 5, 96, mx.bfloat16)])
def test_cuda_decode_attention_matches_reference(heads, kv_heads, dim, dtype):
    kernel = decode_attention.DecodeAttention("cuda", heads, kv_heads, dim, dtype)
    assert decode_attention.verified(kernel) == ""


@pytest.mark.parametrize("width,eps,dtype", [(2560, 1e-6, mx.bfloat16), (576, 1e-5, mx.float16), (97, 1e-5, mx.float32)])
def test_cuda_add_norm_matches_reference(width, eps, dtype):
    assert addnorm.verified(addnorm.AddNorm("cuda", width, eps, dtype)) == ""


def _two_layer_qwen3(seed: int):
    """A two-layer bf16 4-bit Qwen3 with joined projections, heads of 128."""
    from mlx_lm.models import qwen3

    from locals.engine.forward.fuse import fuse_projections

    mx.random.seed(seed)
    args = qwen3.ModelArgs(model_type="qwen3", hidden_size=512, num_hidden_layers=2, intermediate_size=1024,
                           num_attention_heads=8, num_key_value_heads=2, head_dim=128, rms_norm_eps=1e-6,
                           vocab_size=1000, max_position_embeddings=4096, rope_theta=1e6, tie_word_embeddings=True)
    model = qwen3.Model(args)
    model.set_dtype(mx.bfloat16)
    nn.quantize(model, group_size=64, bits=4)
    fuse_projections(model)
    return model


def _three_rows(model, whole: bool = True) -> list[mx.array]:
    """Logits of three prompts (17, 20 and 23 tokens) in one pass, then of two decode steps of the
    three rows in a decode batch, at their different lengths: each step one compiled graph
    (`whole`), else compiled seams around eager attention; then the three rows' keys and values
    in the decode batch (a whole step fills the batch's free slots with padding rows: forward.py
    `step_rows`, so those slots are left out)."""
    from locals.engine.forward.choices import ForwardChoices
    from locals.engine.forward.forward import CompiledBlocks, RowInput, forward
    from locals.engine.forward.kv import DecodeBatch, RowKV

    batch = DecodeBatch(2)
    kv = [RowKV(2, batch) for _ in range(3)]
    prompts = [mx.array(list(range(3 + 5 * i, 20 + 8 * i)), dtype=mx.int32) for i in range(3)]
    out = [forward(model, [RowInput(p, p.size, c, True) for p, c in zip(prompts, kv)])]
    for step in range(2):
        rows = [RowInput(mx.array([11 + step + i], dtype=mx.int32), 1, c, True) for i, c in enumerate(kv)]
        out.append(forward(model, rows, CompiledBlocks(), ForwardChoices(whole_steps=whole)))
    rows_cap = batch.kv[0].shape[0] // 2
    members = [mx.concatenate([k[:3], k[rows_cap:rows_cap + 3]]) for k in batch.kv]
    return [o.astype(mx.float32) for o in out + members]


def _assert_close(got: list[mx.array], expected: list[mx.array]) -> None:
    for g, e in zip(got, expected):
        assert (mx.abs(g - e).max() / mx.abs(e).max()).item() < 3e-2


def test_model_with_fused_kernels_matches_mlx_ops():
    # Every fused kernel, in whole compiled steps and in seams, against MLX's ops in seams.
    model = _two_layer_qwen3(7)
    expected = _three_rows(model, whole=False)
    assert fused.attach(model, "cuda") == {"heads": 2, "norms": 2, "attention": 2}
    # Whole steps: the head kernel writes each row's keys and values into the batch's cache itself.
    assert all(layer.self_attn.head_prep.writes_cache() for layer in model.model.layers)
    _assert_close(_three_rows(model), expected)
    _assert_close(_three_rows(model, whole=False), expected)


def test_device_stamps_order_and_time_a_chain():
    # The stamps read the GPU's nanosecond timer after their input: a chain between two of
    # them takes a positive, plausible time, and it grows with the chain's length.
    from locals.engine.kernels.tuning import clock
    from locals.engine.kernels.reference import cold_problems, quantized_matmul, rotating

    timer = clock.timer(mx.bfloat16)
    assert timer is not None
    first, _ = clock.stamp(mx.zeros((1,)))
    second, _ = clock.stamp(first)
    mx.eval(first, second)
    assert 0 <= clock.nanoseconds(second) - clock.nanoseconds(first) < 10**7
    x, copies = cold_problems(8, 2560, 9728, 4, 64, mx.bfloat16)
    call = rotating(quantized_matmul, x, copies, 64, 4)
    one = sorted(timer(call, 1) for _ in range(5))[2]
    six = sorted(timer(call, 6) * 6 for _ in range(5))[2]
    assert 0 < one < 0.01 and one < six < 0.1


# Each code path once in bf16 (wide, unrolled, 32 columns), the plain one in both dtypes.
GATED_KERNELS = ([(k, mx.bfloat16) for k in qmm.candidates("cuda")
                  if k.takes_gated and (k.unroll > 1 or k.wide or k.cols_per_warp == 32)]
                 + [(k, d) for k in qmm.candidates("cuda") if k.name == "cuda-qmma-r16-t128"
                    for d in (mx.bfloat16, mx.float16)])


@pytest.mark.parametrize("kernel,dtype", GATED_KERNELS, ids=lambda k: getattr(k, "name", str(k).rsplit(".", 1)[-1]))
def test_cuda_tensor_kernel_writes_the_gated_activation(kernel, dtype):
    # A joined [gate | up] weight; silu(gate) * up out, against the float32 truth: halves of 97
    # columns (not a multiple of a tile's 8), 1000 (not of 16) and 1216 (an eighth of Qwen3-4B's),
    # at each row tile's edges.
    from locals.engine.kernels import glu

    rows = [m for m in (1, 5, 8, 13, 16, 17, 21, 32) if kernel.supports(m, 4, 64, dtype, dtype)]
    for n, k in ((2 * 97, 640), (2 * 1000, 1920), (2 * 9728 // 8, 2560)):
        for m in rows:
            assert glu.check_gated(kernel, m, n, k, 4, 64, dtype) == "", (m, n, k)


NORM_KERNELS = [k for k in qmm.candidates("cuda") if k.takes_norm and (k.unroll > 1 or k.wide or k.cols_per_warp == 32
                                                                         or k.name == "cuda-qmma-r16-t256")]


@pytest.mark.parametrize("kernel", NORM_KERNELS, ids=lambda k: k.name)
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16], ids=["bf16", "f16"])
def test_cuda_tensor_kernel_folds_the_residual_add_and_norm(kernel, dtype):
    # x in; h = res + the product and rms_norm(h) * nw out, against the float32 truth, twice on
    # one launch counter that the kernel leaves at zero; column counts that are not a multiple
    # of the tile, K of an odd number of groups, each row tile's edges.
    from locals.engine.kernels import normfold

    rows = [m for m in (1, 5, 8, 13, 16, 17, 21, 32) if kernel.supports(m, 4, 64, dtype, dtype)]
    for n, k in ((200, 640), (1000, 1920)):
        for m in rows:
            assert normfold.check(kernel, m, n, k, 4, 64, dtype, 1e-6) == "", (m, n, k)


def test_model_with_norms_folded_into_tuned_projections_matches_mlx_ops():
    # Three rows decoding through the tensor-core kernels with the residual add and norm
    # folded into o_proj and down_proj, against MLX's ops on the same weights (the model's twin).
    from locals.engine.kernels.twin import mlx_ops_twin

    model = _two_layer_qwen3(9)
    kind, chip = current_chip()
    kernel = next(k for k in qmm.candidates("cuda") if k.name == "cuda-qmma-r16-t256")
    table = TuningTable(chip=chip, mlx=mx.__version__, kernels=kernels_tag(kind), complete=True,
                        choices={p.key: {"3": kernel.name} for p in model_problems(model)})
    assert patch_model(model, table) > 0
    layers = model.model.layers
    # Tuned at 3 rows; 1 and 2 rows take the same kernel (one 8-row tile, registry._fill_in).
    assert all(layer.self_attn.o_proj._routes.norm_rows == {1, 2, 3} for layer in layers)
    assert all(layer.mlp.down_proj._routes.norm_rows == {1, 2, 3} for layer in layers)
    assert all(layer.mlp.fused_gate_up._routes.gated_rows == {1, 2, 3} for layer in layers)  # SwiGLU in gate/up's
    expected = _three_rows(mlx_ops_twin(model), whole=False)
    _assert_close(_three_rows(model), expected)


@pytest.mark.parametrize("n,length", [(33, 1000), (248, 4200), (256, 8192)])
def test_a_bucketed_chunk_through_cudnn_matches_mlx_causal_attention(n, length):
    # cuDNN's attention with a (1, 1, queries, keys) bias over a whole 1,024-position bucket, Qwen3-4B's
    # heads (32 queries on 8 keys, 128 wide, bfloat16), against MLX's causal attention at the exact shape.
    from locals.engine.forward import chunk_attention as ca

    mx.random.seed(n)
    positions = -(-length // ca.ROOM_STEP) * ca.ROOM_STEP
    q = mx.random.normal((1, 32, n, 128)).astype(mx.bfloat16)
    k, v = (mx.random.normal((1, 8, positions, 128)).astype(mx.bfloat16) for _ in range(2))
    want = mx.fast.scaled_dot_product_attention(q, k[:, :, :length], v[:, :, :length], scale=128 ** -0.5,
                                                mask="causal")
    got = ca.bucketed_attention(q, k, v, length, 128 ** -0.5)
    assert got.shape == want.shape
    assert mx.allclose(got.astype(mx.float32), want.astype(mx.float32), atol=2e-2, rtol=2e-2).item()
