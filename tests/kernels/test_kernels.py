"""Small-batch kernels on any device: the references, the verifier, tuning and the model patch."""

from __future__ import annotations

import dataclasses
import json

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from locals.engine.kernels import qmm
from locals.engine.kernels.reference import (MAX_COPIES, DequantizedCandidate, PaddedCandidate, cold_problems,
                                             dequantized_matmul, quantized_matmul, random_problem, rotating)
from locals.engine.kernels.registry import TunedQuantizedLinear, layer_problem, patch_model, tuned_linear
from locals.engine.kernels.tuning.tuner import (MLX_OP, Problem, TuningTable, current_chip, kernels_tag, load_table,
                                          measure, model_problems, save_table, table_path, tune, tuning_rows)
from locals.engine.kernels.tuning.verify import TRUTH_COLUMNS, Case, check, default_cases, passes, truth_columns, verify

SMALL_SHAPES = ((33, 128), (7, 192))


class _Wrapped:
    """A candidate built from a function, for checking what the verifier rejects."""

    def __init__(self, name, fn):
        self.name, self._fn = name, fn

    def supports(self, rows, bits, group_size, dtype, scales_dtype):
        return True

    def __call__(self, x, w, scales, biases, group_size, bits):
        return self._fn(x, w, scales, biases, group_size, bits)


def _shifted_groups(x, w, scales, biases, group_size, bits):
    # A plausible bug: every group uses its neighbour's scale and bias.
    return quantized_matmul(x, w, mx.roll(scales, 1, axis=1), mx.roll(biases, 1, axis=1), group_size, bits)


def _one_nan(x, w, scales, biases, group_size, bits):
    y = quantized_matmul(x, w, scales, biases, group_size, bits)
    return mx.where(mx.arange(y.size).reshape(y.shape) == y.size // 2, mx.nan, y).astype(y.dtype)


def _raises(*_args):
    raise RuntimeError("kernel failed to compile")


def _numpy_dense(w, scales, biases, group_size, bits) -> np.ndarray:
    """dequantize(w) from the packing rules alone: low bits first, one scale+bias a group."""
    packed = np.array(w).astype(np.uint64)
    values = np.stack([(packed >> (bits * j)) & ((1 << bits) - 1) for j in range(32 // bits)], -1)
    values = values.reshape(packed.shape[0], -1).astype(np.float64)
    per_value = lambda a: np.repeat(np.array(a.astype(mx.float32)), group_size, axis=1)  # noqa: E731
    return values * per_value(scales) + per_value(biases)


def _numpy_truth(x, w, scales, biases, group_size, bits):
    """x @ dequantize(w).T in float64."""
    dense = _numpy_dense(w, scales, biases, group_size, bits)
    return (np.array(x.astype(mx.float32)).astype(np.float64) @ dense.T).astype(np.float32)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_quantized_matmul_reference_matches_dense_truth(bits, dtype):
    x, w, scales, biases = random_problem(3, 33, 128, bits, 64, dtype)
    truth = mx.array(_numpy_truth(x, w, scales, biases, 64, bits))
    assert mx.allclose(dequantized_matmul(x, w, scales, biases, 64, bits), truth, atol=1e-5)
    got = quantized_matmul(x, w, scales, biases, 64, bits).astype(mx.float32)
    assert got.shape == (3, 33)
    # Rounding error scales with the sum of the terms' sizes, not with the result (which can
    # cancel): over 600 fresh bfloat16 problems the worst ratio was 0.016, while a wrong
    # packing rule is off by the order of the terms themselves.
    magnitude = np.abs(np.array(x.astype(mx.float32))) @ np.abs(_numpy_dense(w, scales, biases, 64, bits)).T
    error = np.abs(np.array(got) - np.array(truth)) / magnitude
    assert error.max() < (1e-5 if dtype == mx.float32 else 4e-2)


def test_padded_candidate_matches_and_only_serves_small_batches():
    pad = PaddedCandidate(8)
    assert [pad.supports(m, 4, 64, mx.float32, mx.float32) for m in (1, 2, 7, 8)] == [False, True, True, False]
    assert passes(verify(pad, default_cases(4, 64, mx.float32, rows=(2, 5, 7), shapes=SMALL_SHAPES)))
    x, w, scales, biases = random_problem(3, 33, 128, 4, 64, mx.float32)
    assert pad(x.reshape(3, 1, 128), w, scales, biases, 64, 4).shape == (3, 1, 33)


def test_random_problem_is_fresh_each_call():
    a = random_problem(2, 16, 64, 4, 32, mx.float32)[0]
    b = random_problem(2, 16, 64, 4, 32, mx.float32)[0]
    assert not mx.array_equal(a, b)


def test_timing_rotates_through_weight_copies_that_span_the_cold_size():
    # Timing reads weights from memory, as a model's step does: enough distinct copies to
    # pass the cache size, capped; each call takes the next copy, all in turn.
    x, copies = cold_problems(3, 64, 256, 4, 64, mx.float32, cold_bytes=40_000)
    w, scales, biases = copies[0]
    size = w.nbytes + scales.nbytes + biases.nbytes
    assert len(copies) == -(-40_000 // size) and len(copies) * size >= 40_000
    assert not mx.array_equal(copies[0][0], copies[1][0])
    assert len(cold_problems(1, 8, 64, 4, 64, mx.float32, cold_bytes=1 << 30)[1]) == MAX_COPIES
    seen = []
    call = rotating(lambda x_, w_, s_, b_, g, bits: seen.append(id(w_)) or quantized_matmul(x_, w_, s_, b_, g, bits),
                    x, copies, 64, 4)
    outs = [call() for _ in range(2 * len(copies))]
    assert seen == [id(c[0]) for c in copies] * 2
    assert outs[0].shape == (3, 64)
    assert mx.allclose(outs[0], quantized_matmul(x, w, scales, biases, 64, 4)).item()
    assert all(mx.allclose(o, quantized_matmul(x, *c, 64, 4)).item() for o, c in zip(outs, copies * 2))


def test_timed_calls_wait_for_the_one_before():
    # Each call's input is x, but made from the previous call's output, so the device cannot
    # run two calls side by side: a NaN out of one call reaches the next one's input.
    x, copies = cold_problems(2, 64, 128, 4, 64, mx.float32, cold_bytes=1)
    inputs = []

    def fn(x_, w_, s_, b_, g, bits):
        inputs.append(x_)
        return mx.full((2, 64), mx.nan) if len(inputs) == 2 else quantized_matmul(x_, w_, s_, b_, g, bits)
    call = rotating(fn, x, copies, 64, 4)
    for _ in range(2):
        call()
    third = call()
    assert inputs[0] is x and mx.array_equal(inputs[1], x).item()
    assert mx.isnan(inputs[2]).all().item() and mx.isnan(third).all().item()


def test_verifier_passes_a_correct_candidate_on_odd_shapes():
    cases = default_cases(4, 64, mx.bfloat16, rows=(1, 3, 16), shapes=SMALL_SHAPES)
    verdicts = verify(DequantizedCandidate(), cases)
    assert passes(verdicts) and len(verdicts) == 6
    assert {c.k for c in cases} == {128, 192}  # K rounded to whole groups


@pytest.mark.parametrize("fn,reason", [(_shifted_groups, "error"), (_one_nan, "non-finite"), (_raises, "raised")])
def test_verifier_rejects_wrong_candidates(fn, reason):
    verdict = check(_Wrapped("bad", fn), Case(4, 33, 256, 4, 64, mx.float32))
    assert not verdict.ok
    assert reason in verdict.reason


def test_a_wide_layer_is_compared_at_its_edges_and_a_sample():
    cols = np.array(truth_columns(5000))
    assert truth_columns(TRUTH_COLUMNS) is None  # up to the limit, every column
    assert len(cols) == TRUTH_COLUMNS == len(set(cols)) and (np.diff(cols) > 0).all()
    assert set(range(128)) | set(range(5000 - 128, 5000)) <= set(cols)
    assert not np.array_equal(cols, np.array(truth_columns(5000)))  # a fresh sample each time
    case = Case(3, 5000, 128, 4, 64, mx.float32)
    assert check(DequantizedCandidate(), case).ok

    def last_column_wrong(*args):
        out = quantized_matmul(*args)
        return mx.concatenate([out[:, :-1], out[:, -1:] + 1.0], axis=1)
    wrong = check(_Wrapped("edge", last_column_wrong), case)
    assert not wrong.ok and "error" in wrong.reason
    half = _Wrapped("half", lambda *a: quantized_matmul(*a)[:, :2500])
    assert "shape" in check(half, case).reason


def test_verifier_rejects_wrong_shape_and_dtype():
    case = Case(2, 16, 128, 8, 64, mx.bfloat16)
    transposed = _Wrapped("t", lambda *a: quantized_matmul(*a).T)
    widened = _Wrapped("f32", lambda *a: quantized_matmul(*a).astype(mx.float32))
    assert "shape" in check(transposed, case).reason
    assert "dtype" in check(widened, case).reason
    assert not passes([])  # nothing ran is not a pass


def test_measure_interleaves_and_keeps_every_sample():
    calls = []
    fns = {name: (lambda name=name: calls.append(name) or mx.zeros(4)) for name in ("a", "b")}
    samples = measure(fns, rounds=3, repeats=2)
    assert {k: len(v) for k, v in samples.items()} == {"a": 3, "b": 3}
    assert calls[2:] == ["a", "a", "b", "b"] * 3  # after one warm-up call each, rounds alternate
    assert all(s > 0 for v in samples.values() for s in v)


def test_tune_keeps_verified_candidates_and_stores_per_chip():
    # bfloat16: GPU float32 matmuls may run in TF32, which fails the float32 limit (rightly).
    problem = Problem(33, 128, 4, 64, "bfloat16")
    bad = _Wrapped("shifted", _shifted_groups)
    messages = []
    table = tune([problem], rows=[1, 2], candidates=[DequantizedCandidate(), bad], rounds=2, repeats=2,
                 progress=messages.append, screen_shapes=SMALL_SHAPES)
    assert table.complete
    assert "shifted" in table.rejected
    assert set(table.choices[problem.key]) == {"1", "2"}
    assert set(table.choices[problem.key].values()) <= {MLX_OP, "mlx-dequant"}
    assert set(table.timings_us[problem.key]["1"]) == {MLX_OP, "mlx-dequant"}
    path = save_table(table)
    assert path.parent.name == "tuning" and mx.__version__ in path.name
    assert load_table() == table
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "kernels": "another-source"}))
    assert load_table() is None  # kernels changed since tuning: untuned again


def test_tune_pauses_and_resumes():
    problem = Problem(16, 64, 8, 32, "float32")
    table = tune([problem], rows=[1, 2, 3], candidates=[DequantizedCandidate()], rounds=1, repeats=1,
                 pause=lambda: True, screen_shapes=SMALL_SHAPES)
    assert not table.complete and not table.choices.get(problem.key)  # paused while verifying
    table = tune([problem], rows=[1, 2, 3], candidates=[DequantizedCandidate()], table=table, rounds=1, repeats=1,
                 screen_shapes=SMALL_SHAPES)
    assert table.complete and set(table.choices[problem.key]) == {"1", "2", "3"}
    # A later run for more rows that is stopped leaves the table marked incomplete.
    table = tune([problem], rows=[4], candidates=[DequantizedCandidate()], table=table, rounds=1, repeats=1,
                 pause=lambda: True, screen_shapes=SMALL_SHAPES)
    assert not table.complete and "4" not in table.choices[problem.key]


def test_tuning_rows_cover_every_row_count_the_kernels_take():
    from locals.engine.kernels.tuning.tuner import fill_rows

    assert tuning_rows("metal") == tuning_rows("cpu") == list(range(1, qmm.MAX_ROWS + 1))
    # CUDA times the row tiles' edges; every count up to the wide kernels' 32 takes a choice.
    assert tuning_rows("cuda") == [2, 4, 8, 16, qmm.WIDE_MAX_ROWS]
    assert fill_rows("cuda") == list(range(1, qmm.WIDE_MAX_ROWS + 1))
    assert all(candidate.tensor for candidate in qmm.candidates("cuda"))


def test_ctrl_c_or_sigterm_stops_tuning_at_a_pause_point():
    import os
    import signal

    from locals.cli.tune import stop_requested

    before = signal.getsignal(signal.SIGTERM)
    with stop_requested() as stop:
        assert not stop.is_set()
        os.kill(os.getpid(), signal.SIGTERM)  # would end the process without the handler
        assert stop.wait(5)
        problem = Problem(16, 64, 8, 32, "float32")
        table = tune([problem], rows=[1], candidates=[DequantizedCandidate()], rounds=1, repeats=1,
                     pause=stop.is_set, screen_shapes=SMALL_SHAPES)
        assert not table.complete
    assert signal.getsignal(signal.SIGTERM) is before


def _quantized_mlp():
    mx.random.seed(0)
    model = nn.Sequential(nn.Linear(128, 192, bias=False), nn.Linear(192, 64, bias=True))
    nn.quantize(model, group_size=64, bits=4)
    return model


def _table_choosing(model, name, rows):
    kind, chip = current_chip()
    return TuningTable(chip=chip, mlx=mx.__version__, kernels=kernels_tag(kind), complete=True,
                       choices={p.key: {str(m): name for m in rows} for p in model_problems(model)})


def test_patch_model_swaps_tuned_layers_and_keeps_outputs():
    model = _quantized_mlp()
    x = mx.random.normal((2, 1, 128))
    expected = model(x)
    keys = sorted(k for k, _ in nn.utils.tree_flatten(model.parameters()))
    assert patch_model(model, _table_choosing(model, "mlx-dequant", rows=[2])) == 2
    assert all(isinstance(layer, TunedQuantizedLinear) for layer in model.layers)
    assert sorted(k for k, _ in nn.utils.tree_flatten(model.parameters())) == keys
    # GPU float32 matmuls may use TF32, so the dequantized route differs from MLX's op by ~1e-3.
    assert mx.allclose(model(x), expected, rtol=1e-2, atol=1e-2)
    assert patch_model(model, _table_choosing(model, "mlx-dequant", rows=[2])) == 0  # already swapped


def test_patch_model_leaves_model_alone_without_a_usable_choice():
    model = _quantized_mlp()
    assert patch_model(model) == 0  # no table stored for this chip
    assert patch_model(model, _table_choosing(model, MLX_OP, rows=range(1, 17))) == 0
    assert patch_model(model, _table_choosing(model, "no-such-kernel", rows=[1])) == 0
    table = _table_choosing(model, "mlx-dequant", rows=[1])
    table.rejected["mlx-dequant"] = "failed verification"
    assert patch_model(model, table) == 0
    assert all(type(layer) is nn.QuantizedLinear for layer in model.layers)


def test_tuned_linear_routes_by_row_count():
    layer = _quantized_mlp().layers[0]
    tuned = tuned_linear(layer, _table_choosing(nn.Sequential(layer), "mlx-dequant", rows=[3]))
    assert isinstance(tuned, TunedQuantizedLinear)
    assert tuned._routes.get(3) is not None and tuned._routes.get(4) is None
    x = mx.random.normal((4, 128))
    assert mx.array_equal(tuned(x), layer(x))  # 4 rows: MLX's own op, bit for bit
    assert tuned_linear(nn.Linear(8, 8), None) is not None


def test_row_counts_the_table_lacks_take_the_kernel_of_their_tile(monkeypatch):
    from locals.engine.kernels.registry import _routes_for

    by_name = {c.name: c for c in qmm.candidates("cuda")}
    narrow, wide = by_name["cuda-qmma-r16-t256"], by_name["cuda-qmma-r32-t256-wide"]
    problem = Problem(n=2560, k=9728, bits=4, group_size=64, dtype="bfloat16")
    # As the H200's table: rows 2, 4, 8, 16 and 32 tuned; 6 rows timed and MLX's op won there.
    choices = {"2": narrow.name, "4": "mlx-pad8", "6": MLX_OP, "8": narrow.name, "16": narrow.name, "32": wide.name}
    table = TuningTable(chip="cuda:NVIDIA H200", mlx=mx.__version__, kernels=kernels_tag("cuda"),
                        choices={problem.key: choices})
    routes = _routes_for(problem, table, {**by_name, "mlx-pad8": PaddedCandidate(8)})
    assert routes[1] is narrow  # one row is not tuned on CUDA: it takes two rows' kernel (same tile)
    assert routes[3].name == "mlx-pad8"  # 4's choice, padded to 8 rows either way
    assert 5 not in routes and 6 not in routes  # 6 timed and MLX's op won: 5 takes that
    assert routes[7] is narrow  # 8's kernel, one 8-row tile
    assert all(routes[m] is narrow for m in range(9, 17))  # 16's, one 16-row tile
    assert all(routes[m] is wide for m in range(17, 33))  # 32's (17-32 rows: the wide kernel)
    assert max(routes) == 32
    # No fill-in across tiles: with only 16 tuned, 2..8 (an 8-row tile) keep MLX's op.
    table.choices[problem.key] = {"16": narrow.name}
    assert sorted(_routes_for(problem, table, by_name)) == list(range(9, 17))
    table.rejected[narrow.name] = "failed verification"
    assert _routes_for(problem, table, by_name) == {}


def test_wide_passes_take_dense_matmuls_and_fewer_rows_keep_their_routes():
    from locals.engine.kernels.registry import WIDE_ROWS, route_wide_passes

    model = _quantized_mlp()
    few, wide = mx.random.normal((8, 128)), mx.random.normal((WIDE_ROWS + 37, 128))
    expected_few, expected_wide = model(few), model(wide)
    table = _table_choosing(model, "mlx-dequant", rows=[3])
    table.choices.pop(layer_problem(model.layers[1]).key)  # one layer tuned, the other left plain
    assert patch_model(model, table) == 1
    assert route_wide_passes(model) == 2
    assert all(isinstance(layer, TunedQuantizedLinear) for layer in model.layers)
    for layer in model.layers:
        assert layer._routes.get(8) is None  # a decode step's rows: MLX's op
        assert layer._routes.get(WIDE_ROWS).name == layer._routes.get(4 * WIDE_ROWS).name == "mlx-dequant"
    assert model.layers[0]._routes.get(3) is not None and "from 256 rows" in repr(model.layers[0]._routes)
    assert mx.array_equal(model(few), expected_few)
    assert mx.allclose(model(wide), expected_wide, rtol=1e-2, atol=1e-2)


def test_wide_passes_read_dense_copies_where_they_fit_and_keep_them_out_of_the_parameters():
    from mlx.utils import tree_flatten

    from locals.engine.kernels.registry import (DENSE_ROWS, DENSE_SHARE, dense_copy_bytes, kept_copy_bytes,
                                                route_wide_passes)

    model = _quantized_mlp()
    few, wide = mx.random.normal((8, 128)), mx.random.normal((DENSE_ROWS, 128))
    expected_few, expected_wide = model(few), model(wide)
    parameters = {k: v.shape for k, v in tree_flatten(model.parameters())}
    copies = dense_copy_bytes(list(model.layers))
    assert copies == 4 * (192 * 128 + 64 * 192)  # float32 scales: float32 copies
    assert route_wide_passes(model, memory_bytes=int(copies / DENSE_SHARE)) == 2
    assert kept_copy_bytes(model) == copies
    for layer in model.layers:
        assert layer._routes.get(DENSE_ROWS - 1) is None and layer._routes.get(DENSE_ROWS).name == "dense-copy"
        assert layer._routes.get(DENSE_ROWS).weight.dtype == layer["scales"].dtype
    assert {k: v.shape for k, v in tree_flatten(model.parameters())} == parameters  # not saved, not trained
    assert mx.array_equal(model(few), expected_few)
    assert mx.allclose(model(wide), expected_wide, rtol=1e-4, atol=1e-4)
    small = _quantized_mlp()  # a card too small for the copies: the weights dequantized per call, from 256 rows
    route_wide_passes(small, memory_bytes=int(copies / DENSE_SHARE) - 1)
    assert kept_copy_bytes(small) == 0
    assert small.layers[0]._routes.get(DENSE_ROWS) is None and small.layers[0]._routes.get(256).name == "mlx-dequant"


def test_model_problems_lists_distinct_layer_shapes():
    problems = model_problems(_quantized_mlp())
    assert {p.key for p in problems} == {"q4-g64-float32-192x128", "q4-g64-float32-64x192"}


def test_cpu_has_no_device_kernels_and_metal_source_is_distinct():
    assert qmm.candidates("cpu") == []
    names = {k.name for k in qmm.candidates("cuda")} | {k.name for k in qmm.candidates("metal")}
    cuda = qmm.candidates("cuda")
    assert len(names) == 12 and all(k.tensor for k in cuda) and sum(k.wide for k in cuda) == 2
    assert {k.variant for k in cuda} == {"qmma"} and len({k.name for k in cuda}) == len(cuda)
    # The residual add + norm form takes one block per column tile: every candidate (none splits K).
    assert all(k.takes_norm for k in cuda)
    assert qmm.CUDA_TAG != qmm.METAL_TAG
    assert [qmm.row_bucket(m) for m in (1, 2, 3, 5, 9, 16)] == [1, 2, 4, 8, 16, 16]


def test_tensor_kernel_declines_what_it_cannot_compute():
    kernel = qmm.QmvKernel("cuda", 16, 256, tensor=True)
    assert kernel.name == "cuda-qmma-r16-t256"
    assert not kernel.supports(4, 8, 64, mx.bfloat16, mx.bfloat16)  # 8-bit
    assert not kernel.supports(4, 4, 64, mx.float32, mx.float32)  # no float32 mma here
    assert not kernel.supports(17, 4, 64, mx.float16, mx.float16)
    assert kernel.supports(16, 4, 32, mx.float16, mx.float16)
    wide = qmm.QmvKernel("cuda", 16, 256, tensor=True, wide=True)
    assert wide.name == "cuda-qmma-r16-t256-wide"
    assert [m for m in range(1, 40) if wide.supports(m, 4, 64, mx.bfloat16, mx.bfloat16)] == list(range(17, 33))
    split = qmm.QmvKernel("cuda", 16, 128, tensor=True, unroll=2, k_split=4, wide=True)
    assert split.name == "cuda-qmma-r16-t128-u2-k4-wide"


def test_table_path_is_per_chip_and_version(locals_home):
    path = table_path("cuda:NVIDIA H200", "0.32.4")
    assert path == locals_home / "cache" / "tuning" / "cuda-nvidia-h200-mlx0.32.4.json"


def test_a_shipped_table_serves_until_the_user_tunes_and_a_stale_one_never(locals_home, tmp_path, monkeypatch):
    from locals.engine.kernels.tuning import tuner

    monkeypatch.setattr(tuner, "SHIPPED_TABLES", tmp_path)
    model = _quantized_mlp()
    kind, chip = current_chip()
    shipped = _table_choosing(model, "mlx-dequant", rows=[3])
    name = table_path(chip, mx.__version__).name
    assert load_table() is None
    (tmp_path / name).write_text(json.dumps(dataclasses.asdict(shipped)))
    assert load_table().choices == shipped.choices  # nothing tuned here: the shipped table serves
    mine = _table_choosing(model, "mlx-pad8", rows=[4])
    save_table(mine)
    assert load_table().choices == mine.choices  # the user's own table comes first
    table_path(chip, mx.__version__).unlink()
    (tmp_path / name).write_text(json.dumps({**dataclasses.asdict(shipped), "kernels": "0000000000"}))
    assert load_table() is None  # shipped for other kernel sources: untuned, not wrong


def test_shipped_tables_match_the_kernel_sources_they_name():
    """A kernel source change makes a shipped table stale: re-tune on that chip
    (`locals tune --fresh --model <model>`) and ship the new table, or delete it."""
    from locals.engine.kernels.tuning.tuner import FORMAT, SHIPPED_TABLES, kernels_tag

    tables = sorted(SHIPPED_TABLES.glob("*.json"))
    assert tables, "the H200's table ships with locals"
    for path in tables:
        table = TuningTable(**json.loads(path.read_text()))
        assert path.name == table_path(table.chip, table.mlx).name
        assert table.format == FORMAT and table.complete and table.choices
        assert table.kernels == kernels_tag(table.chip.split(":", 1)[0]), f"{path.name} is stale"
