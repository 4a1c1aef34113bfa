"""The residual add and RMSNorm folded into the kernel of the projection before them
(kernels/normfold.py): the truth it is checked against, which row counts get folded, the
layer's `add_norm` call, and a model's forward through it. The CUDA kernel itself runs only
on its device (tests/kernels/test_kernels_cuda.py); here a candidate built from MLX's ops honours
the same contract."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from locals.engine.forward.forward import CompiledBlocks, RowInput, forward, step_rows
from locals.engine.forward.fuse import fuse_projections
from locals.engine.kernels import normfold
from locals.engine.kernels.reference import quantized_matmul, random_problem
from locals.engine.kernels.registry import TunedQuantizedLinear
from locals.engine.kernels.tuning.verify import compare
from locals.engine.forward.kv import DecodeBatch, RowKV
from tests.helpers.kernel_models import as_on_a_gpu, run_forward, tiny_qwen3

BF16 = mx.bfloat16


def _matmul(x, w, scales, biases, group_size, bits):
    """In float32, rounded once (MLX's CPU op accumulates bf16 in bf16: too far from the truth)."""
    f32 = mx.float32
    return quantized_matmul(x.astype(f32), w, scales.astype(f32), biases.astype(f32), group_size, bits).astype(x.dtype)


class OpsNorm:
    """A kernel that also takes the residual add and norm after the product (`add_norm`),
    computed with MLX's ops; `wrong` is "weight" (forgets the norm's weight) or "h" (returns
    the residual stream it was given)."""

    takes_norm = True

    def __init__(self, name: str = "ops-norm", wrong: str = ""):
        self.name, self.wrong, self.folded = name, wrong, 0

    def __call__(self, x, w, scales, biases, group_size, bits):
        return quantized_matmul(x, w, scales, biases, group_size, bits)

    def add_norm(self, x, res, nw, eps, count, w, scales, biases, group_size):
        assert count.dtype == mx.uint32 and count[0].item() == 0
        self.folded += 1
        h = res + _matmul(x, w, scales, biases, group_size, 4)
        normed = mx.fast.rms_norm(h, None if self.wrong == "weight" else nw, eps[0].item())
        return res if self.wrong == "h" else h, normed


def test_truth_is_the_matmul_then_the_add_then_the_norm():
    _x, w, scales, biases = random_problem(1, 40, 128, 4, 64, mx.float32)
    x, res, nw = mx.random.normal((3, 128)), mx.random.normal((3, 40)), mx.random.normal((40,))
    h, normed = normfold.reference(x, res, nw, 1e-6, w, scales, biases, 64, 4)
    expected = res + quantized_matmul(x, w, scales, biases, 64, 4)
    np.testing.assert_allclose(np.array(h), np.array(expected), rtol=1e-4, atol=1e-4)
    norm = nn.RMSNorm(40, eps=1e-6)
    norm.weight = nw
    np.testing.assert_allclose(np.array(normed), np.array(norm(expected)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("wrong", ["weight", "h"])
def test_check_rejects_a_kernel_that_gets_either_output_wrong(wrong):
    assert normfold.check(OpsNorm(), 3, 40, 128, 4, 64, BF16, 1e-6) == ""
    assert normfold.check(OpsNorm(wrong=wrong), 3, 40, 128, 4, 64, BF16, 1e-6) != ""


def test_rows_fold_only_for_kernels_that_take_the_norm_and_pass():
    plain = type("Plain", (), {"name": "plain", "takes_norm": False})()
    good, bad = OpsNorm("good-norm"), OpsNorm("bad-norm", wrong="weight")
    routes = {1: good, 2: good, 9: good, 12: good, 3: bad, 4: plain}
    assert normfold.foldable_rows(routes, 40, 128, 4, 64, BF16, 1e-6) == {1, 2, 9, 12}
    assert normfold.foldable_rows(routes, 40, 128, 4, 64, mx.float32, 1e-6) == set()  # the mma kernels' dtypes
    assert normfold.foldable_rows(routes, 33, 128, 4, 64, BF16, 1e-6) == set()  # rows read 8 values at a time
    assert "error" in normfold.verified(bad, 3, 40, 128, 4, 64, BF16, 1e-6)


def _bf16_qwen3():
    model = tiny_qwen3(False)
    model.set_dtype(BF16)
    nn.quantize(model, group_size=64, bits=4)
    mx.eval(model.parameters())
    return model


def test_a_layer_folds_the_rows_that_passed_and_no_others():
    mx.random.seed(2)
    layer = nn.QuantizedLinear(128, 48, bias=False, group_size=64, bits=4)
    layer.set_dtype(BF16)
    norm = nn.RMSNorm(48, eps=1e-6)
    norm.weight = (1 + mx.random.normal((48,))).astype(BF16)
    kernel = OpsNorm("ops-norm-layer")
    tuned = TunedQuantizedLinear(layer, {2: kernel, 5: kernel})
    x, res = mx.random.normal((2, 128)).astype(BF16), mx.random.normal((2, 48)).astype(BF16)
    assert tuned.add_norm(x, res, norm) is None  # not checked yet
    assert tuned.fold_norm(1e-6) == 2 and "add + norm folded at rows [2, 5]" in repr(tuned._routes)
    got_h, got = tuned.add_norm(x, res, norm)
    truth_h, truth = normfold.reference(x, res, norm.weight, 1e-6, tuned["weight"], tuned["scales"],
                                        tuned["biases"], 64, 4)
    assert compare(got_h, truth_h, BF16) == "" and compare(got, truth, BF16) == ""
    assert tuned.add_norm(mx.zeros((3, 128), dtype=BF16), mx.zeros((3, 48), dtype=BF16), norm) is None  # no route
    assert tuned.add_norm(x, res, nn.LayerNorm(48)) is None  # only a plain RMSNorm


def _fold_every_o_and_down_proj(model, rows: int) -> "OpsNorm":
    """Every o_proj and down_proj tuned at `rows` rows to one `OpsNorm`, its add + norm form checked."""
    kernel = OpsNorm()
    for layer in model.model.layers:
        for block, name in ((layer.self_attn, "o_proj"), (layer.mlp, "down_proj")):
            block[name] = TunedQuantizedLinear(block[name], {rows: kernel})
            assert block[name].fold_norm(1e-6) == 1
    return kernel


def test_forward_folds_the_add_and_norm_into_o_proj_and_down_proj():
    model = _bf16_qwen3()
    fuse_projections(model)
    prompt = [5, 17, 42, 7, 99, 3]
    before = run_forward(model, prompt, CompiledBlocks())
    kernel = _fold_every_o_and_down_proj(model, rows=1)
    checks = kernel.folded
    after = run_forward(model, prompt, CompiledBlocks())
    for a, b in zip(after, before):  # bf16 rounding apart: the folded matmul accumulates in float32
        assert np.abs(a - b).max() < 0.05 * np.abs(b).max()
    # The decode steps (one row) folded every add + norm but the last layer's, whose sum the
    # final norm reads: traced once, the second step replays the compiled seams.
    assert kernel.folded - checks == 2 * len(model.model.layers) - 1


def test_whole_decode_steps_fold_the_final_norm_into_the_last_down_proj():
    # Rows in a decode batch decode in whole compiled steps, where every row samples: the
    # last layer's down_proj folds the residual add with the model's final norm too.
    model = _bf16_qwen3()
    fuse_projections(model)
    prompts = [[5, 17, 42, 7, 99, 3], [8, 1, 4]]
    batches = []

    def run() -> list[np.ndarray]:
        batch = DecodeBatch(len(model.model.layers))
        batches.append(batch)
        kv = [RowKV(len(model.model.layers), batch) for _ in prompts]
        forward(model, [RowInput(mx.array(p, dtype=mx.int32), len(p), c, False) for p, c in zip(prompts, kv)])
        compiled = CompiledBlocks()
        return [np.array(forward(model, [RowInput(mx.array([t + i], dtype=mx.int32), 1, c, True)
                                         for i, c in enumerate(kv)], compiled, as_on_a_gpu()).astype(mx.float32))
                for t in (7, 11, 13)]

    before = run()
    # A whole step runs every slot of the batch (forward.step_rows): the kernel is tuned at that count.
    kernel = _fold_every_o_and_down_proj(model, rows=step_rows(len(prompts), batches[0].rows_cap))
    checks = kernel.folded
    after = run()
    for a, b in zip(after, before):
        assert np.abs(a - b).max() < 0.05 * np.abs(b).max()
    # The rows join the batch on their first step: three whole steps of one shape, traced once,
    # every add + norm folded, the last layer's with the final norm (seams fold all but that one).
    assert kernel.folded - checks == 2 * len(model.model.layers)


def test_patching_folds_o_proj_and_down_proj(monkeypatch):
    from locals.engine.kernels import registry
    from locals.engine.kernels.registry import layer_problem, patch_model
    from locals.engine.kernels.tuning.tuner import TuningTable

    kernel = OpsNorm("ops-norm-patch")
    monkeypatch.setattr(registry, "_candidates_by_name", lambda: {kernel.name: kernel})
    for folded in ({1, 4},):
        model = _bf16_qwen3()
        fuse_projections(model)
        layers = model.model.layers
        keys = {layer_problem(layer).key for block in layers for layer in (block.self_attn.fused_qkv,
                                                                            block.self_attn.o_proj,
                                                                            block.mlp.down_proj)}
        table = TuningTable(chip="test", mlx=mx.__version__, kernels="test", complete=True,
                            choices={key: {"1": kernel.name, "4": kernel.name} for key in keys})
        assert patch_model(model, table) > 0
        for layer in layers:
            assert layer.self_attn.o_proj._routes.norm_rows == folded
            assert layer.mlp.down_proj._routes.norm_rows == folded
            assert not layer.self_attn.fused_qkv._routes.norm_rows  # no add + norm after it
        assert registry.folded_counts(model)["norms"] == (2 * len(layers) if folded else 0)  # what `locals status` says


def test_kernel_constants_are_padded_past_mlx_small_array_pool():
    from locals.engine.kernels.resident import device_array

    count = device_array([0], mx.uint32)
    assert count.nbytes >= 16 and count.tolist() == [0, 0, 0, 0]
    params = device_array([1.5, -2.0, 3.25], mx.float32)
    assert params.dtype == mx.float32 and params.tolist() == [1.5, -2.0, 3.25, 0.0]
    dims = device_array([32, 8, 0, 4096, 5120], mx.int32)  # 20 bytes: nothing to pad
    assert dims.tolist() == [32, 8, 0, 4096, 5120]
