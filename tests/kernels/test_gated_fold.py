"""SwiGLU folded into the joined gate/up layer's kernel (kernels/glu.py): the truth it is checked
against, which row counts get folded, the layer's `gated` call, and a model's forward through it.
The CUDA kernel itself runs only on its device (tests/kernels/test_kernels_cuda.py); here a candidate
built from MLX's ops honours the same contract."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.activations import swiglu

from locals.engine.forward.choices import ForwardChoices
from locals.engine.forward.forward import CompiledBlocks
from locals.engine.forward.fuse import fuse_projections
from locals.engine.kernels import glu
from locals.engine.kernels.reference import quantized_matmul, random_problem
from locals.engine.kernels.registry import TunedQuantizedLinear
from tests.helpers.kernel_models import run_forward, tiny_qwen3


class OpsGated:
    """A kernel that also writes silu(gate) * up of a joined [gate | up] weight (`gated=True`),
    computed with MLX's ops; `wrong` swaps gate and up, a plausible bug."""

    takes_gated = True

    def __init__(self, name: str = "ops-gated", wrong: bool = False):
        self.name, self.wrong, self.folded = name, wrong, 0

    def __call__(self, x, w, scales, biases, group_size, bits, gated=False):
        y = quantized_matmul(x, w, scales, biases, group_size, bits)
        if not gated:
            return y
        self.folded += 1
        gate, up = mx.split(y, 2, axis=-1)
        return swiglu(up, gate) if self.wrong else swiglu(gate, up)


def _layer(n=48, k=128):
    mx.random.seed(2)
    layer = nn.QuantizedLinear(k, n, bias=False, group_size=64, bits=4)
    mx.eval(layer.parameters())
    return layer


def test_forward_takes_the_activation_from_the_gate_up_kernel():
    model = tiny_qwen3(True)
    fuse_projections(model)
    prompt = [5, 17, 42, 7, 99, 3]
    before = run_forward(model, prompt, CompiledBlocks())
    kernel = OpsGated()
    for layer in model.model.layers:
        layer.mlp.fused_gate_up = tuned = TunedQuantizedLinear(layer.mlp.fused_gate_up, {1: kernel})
        assert tuned.fold_gated() == 1
    checks = kernel.folded
    after = run_forward(model, prompt, CompiledBlocks())
    for a, b in zip(after, before):
        np.testing.assert_allclose(a, b, rtol=2e-2, atol=2e-2)
    # The two decode steps (one row) took the activation from the kernel in every layer; the prompt did not.
    assert kernel.folded - checks >= len(model.model.layers)
    # An engine that chose MLX's activation (benchmarks' baseline) leaves the kernel's form alone.
    checks = kernel.folded
    ungated = run_forward(model, prompt, CompiledBlocks(), ForwardChoices(gated=False))
    np.testing.assert_allclose(ungated[-1], before[-1], rtol=2e-2, atol=2e-2)
    assert kernel.folded == checks


def test_gated_truth_is_the_matmul_then_the_activation():
    x, w, scales, biases = random_problem(3, 48, 128, 4, 64, mx.float32)
    gate, up = mx.split(quantized_matmul(x, w, scales, biases, 64, 4), 2, axis=-1)
    truth = glu.gated_reference(x, w, scales, biases, 64, 4)
    assert truth.shape == (3, 24)
    np.testing.assert_allclose(np.array(truth), np.array(swiglu(gate, up)), rtol=1e-4, atol=1e-4)


def test_gated_rows_only_for_kernels_that_write_it_and_pass():
    good, bad = OpsGated("gated-good"), OpsGated("gated-bad", wrong=True)
    plain = type("Plain", (), {"name": "plain-gated", "takes_gated": False})()
    routes = {2: good, 5: good, 16: good, 3: bad, 4: plain}
    assert glu.gated_rows(routes, 48, 128, 4, 64, mx.float32) == {2, 5, 16}
    assert "error" in glu.verified(bad, 3, 48, 128, 4, 64, mx.float32)
    assert glu.gated_rows(routes, 47, 128, 4, 64, mx.float32) == set()  # no halves to pair


def test_a_joined_layer_writes_the_activation_for_the_rows_that_passed():
    kernel = OpsGated("ops-gated-layer")
    layer = _layer(n=48)
    tuned = TunedQuantizedLinear(layer, {2: kernel, 7: kernel})
    x = mx.random.normal((2, 128))
    assert tuned.gated(x) is None  # not checked yet
    assert tuned.fold_gated() == 2 and "silu(gate) * up at rows [2, 7]" in repr(tuned._routes)
    gate, up = mx.split(layer(x), 2, axis=-1)
    np.testing.assert_allclose(np.array(tuned.gated(x)), np.array(swiglu(gate, up)), rtol=1e-5, atol=1e-5)
    assert tuned.gated(mx.zeros((3, 128))) is None  # no route for 3 rows


def test_patching_gates_the_joined_gate_up(monkeypatch):
    from locals.engine.kernels import registry
    from locals.engine.kernels.registry import folded_counts, layer_problem, patch_model
    from locals.engine.kernels.tuning.tuner import TuningTable

    kernel = OpsGated("ops-gated-patch")
    monkeypatch.setattr(registry, "_candidates_by_name", lambda: {kernel.name: kernel})
    for gated in ({1, 4},):
        model = tiny_qwen3(True)
        fuse_projections(model)
        layers = model.model.layers
        key = layer_problem(layers[0].mlp.fused_gate_up).key
        table = TuningTable(chip="test", mlx=mx.__version__, kernels="test", complete=True,
                            choices={key: {"1": kernel.name, "4": kernel.name}})
        assert patch_model(model, table) == len(layers)
        assert all(layer.mlp.fused_gate_up._routes.gated_rows == gated for layer in layers)
        assert folded_counts(model)["activations"] == (len(layers) if gated else 0)
