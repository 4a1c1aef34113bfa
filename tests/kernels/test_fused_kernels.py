"""Fused q/k norm + RoPE and residual add + norm: which layers they cover, the forward's use
of their contracts, the verifiers that gate them, and that they are never attached where they
cannot run.

The CUDA and Metal kernels themselves run only on their devices (tests/kernels/test_kernels_cuda.py);
here candidates built from MLX's ops stand in, honouring the same contracts."""

from __future__ import annotations

import dataclasses

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models import llama

from locals.engine.forward import layer_pass as fwd
from locals.engine.forward.choices import ForwardChoices
from locals.engine.forward.forward import CompiledBlocks, RowInput, forward
from locals.engine.forward.fuse import fuse_projections
from locals.engine.kernels import addnorm, fused
from locals.engine.kernels.addnorm import AddNorm
from locals.engine.kernels.headprep import HeadSpec, cache_verified, check, check_into_cache, spec_of, verified
from locals.engine.forward.kv import RowKV

from tests.helpers.kernel_models import OpsHeadPrep, run_forward, tiny_qwen3


def _qwen3(head_dim: int = 64, seed: int = 5):
    model = tiny_qwen3(False, seed=seed, head_dim=head_dim)
    # Norm weights start at one; random ones show a norm applied with the wrong weight.
    for layer in model.model.layers:
        for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
            norm.weight = 1 + 0.5 * mx.random.normal(norm.weight.shape)
    mx.eval(model.parameters())
    return model


def _llama(**extra):
    mx.random.seed(6)
    args = llama.ModelArgs(model_type="llama", hidden_size=256, num_hidden_layers=2, intermediate_size=256,
                           num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=300,
                           tie_word_embeddings=True, max_position_embeddings=2048, **extra)
    model = llama.Model(args)
    mx.eval(model.parameters())
    return model


def test_spec_covers_plain_rope_with_or_without_qk_norms():
    spec = spec_of(_qwen3().model.layers[0].self_attn)
    assert spec == HeadSpec(heads=4, kv_heads=2, head_dim=64, norm=True, eps=1e-6, traditional=False,
                            base=10000.0, scale=1.0)
    plain = spec_of(_llama(rope_traditional=True).model.layers[0].self_attn)
    assert plain.norm is False and plain.traditional is True and plain.head_dim == 64
    # Head sizes whose half is not a whole number of 32-lane groups, and scaled RoPE variants
    # (Llama 3's frequencies), stay on MLX's ops.
    assert spec_of(_qwen3(head_dim=32).model.layers[0].self_attn) is None
    partial = _qwen3(head_dim=128).model.layers[0].self_attn
    partial.rope = nn.RoPE(64, traditional=False, base=10000.0)  # RoPE over half of each 128-wide head
    assert spec_of(partial) is None
    llama3 = _llama(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 1024})
    assert spec_of(llama3.model.layers[0].self_attn) is None


class OpsAddNorm(AddNorm):
    """The add + norm contract computed with MLX's ops."""

    def __call__(self, a, b, weight):
        return addnorm.reference(a, b, weight, self.eps)


def _attach_ops(model, heads: bool, norms: bool) -> None:
    for layer in model.model.layers:
        if heads:
            layer.self_attn.head_prep = OpsHeadPrep("cpu", spec_of(layer.self_attn), mx.float32)
        for norm in (layer.input_layernorm, layer.post_attention_layernorm) if norms else ():
            norm.add_norm = OpsAddNorm("cpu", norm.weight.shape[0], norm.eps, mx.float32)


@pytest.mark.parametrize("build", [_qwen3, lambda: _llama(rope_traditional=True)], ids=["qwen3", "llama-trad"])
@pytest.mark.parametrize("joined", [True, False], ids=["joined", "parts"])
@pytest.mark.parametrize("heads,norms", [(True, True), (True, False), (False, True)], ids=["both", "heads", "norms"])
def test_forward_through_the_contracts_computes_what_mlx_ops_compute(build, joined, heads, norms, monkeypatch):
    model = build()
    fuse_projections(model)
    choices = ForwardChoices(joined_qkv_max_tokens=64 if joined else 0)
    prompt = [5, 17, 42, 7, 99, 3]
    before = run_forward(model, prompt, CompiledBlocks(), choices)
    seen, added = [], []
    _attach_ops(model, heads, norms)
    real_prep, real_add = OpsHeadPrep.__call__, OpsAddNorm.__call__
    monkeypatch.setattr(OpsHeadPrep, "__call__", lambda self, *a: seen.append(a[3]) or real_prep(self, *a))
    monkeypatch.setattr(OpsAddNorm, "__call__", lambda self, *a: added.append(a[0].shape) or real_add(self, *a))
    after = run_forward(model, prompt, CompiledBlocks(), choices)
    for a, b in zip(after, before):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    attn = model.model.layers[0].self_attn
    q_cols, kv_cols = attn.n_heads * 64, attn.n_kv_heads * 64
    # Joined: q, k and v read from the one q/k/v output at their offsets; parts: from their own.
    assert set(seen) == (({(0, q_cols, q_cols + kv_cols)} if joined else {(0, 0, 0)}) if heads else set())
    # Every add but the last layer's MLP residual (the final norm takes only the sampled rows):
    # 2 a layer less one, per pass; traced once per compiled shape, so at least one pass' worth.
    assert (len(added) >= 2 * len(model.model.layers) - 1) == norms
    # An engine that chose MLX's ops (benchmarks' baseline), and the twin mlx-lm runs on, use none.
    from locals.engine.kernels.twin import mlx_ops_twin

    for ran in (lambda: run_forward(model, prompt, CompiledBlocks(), dataclasses.replace(choices, fused=False)),
                lambda: run_forward(mlx_ops_twin(model), prompt, CompiledBlocks(), choices)):
        seen.clear()
        added.clear()
        np.testing.assert_allclose(ran()[-1], before[-1], rtol=1e-5, atol=1e-5)
        assert seen == [] and added == []


class _Broken(OpsHeadPrep):
    def __init__(self, spec, how):
        super().__init__("cpu", spec, mx.float16)
        object.__setattr__(self, "how", how)

    def __call__(self, *args):
        q, kv = super().__call__(*args)
        if self.how == "raise":
            raise RuntimeError("launch failed")
        if self.how == "nan":
            return q, kv * mx.array(float("nan"), dtype=kv.dtype)
        if self.how == "no-norm":  # rotated but never normalized
            plain = HeadSpec(**{**self.spec.__dict__, "norm": False})
            return OpsHeadPrep("cpu", plain, mx.float16)(*args)
        if self.how == "values":  # the keys' rows repeated where the values go
            half = kv.shape[0] // 2
            return q, mx.concatenate([kv[:half], kv[:half]])
        return q[:, :, :, ::-1], kv  # "pairs": q's values in the wrong order


SPEC = HeadSpec(heads=6, kv_heads=2, head_dim=64, norm=True, eps=1e-6, traditional=False, base=1e6, scale=1.0)


def test_verifier_passes_the_contract_and_rejects_wrong_kernels():
    for dtype in (mx.float16, mx.bfloat16, mx.float32):
        assert verified(OpsHeadPrep("cpu", SPEC, dtype)) == ""
    # (Broken ones through check(): verified() remembers a verdict per spec and dtype.)
    assert check(_Broken(SPEC, "raise"), 1, joined=False) == "raised RuntimeError: launch failed"
    assert check(_Broken(SPEC, "nan"), 3, joined=False) == "non-finite output"
    for how in ("no-norm", "pairs", "values"):
        assert check(_Broken(SPEC, how), 8, joined=True).startswith("error ")


class _BrokenWrite(OpsHeadPrep):
    def __init__(self, spec, how):
        super().__init__("cpu", spec, mx.bfloat16)
        object.__setattr__(self, "how", how)

    def into_cache(self, *args):
        *rest, cache, slots = args
        if self.how == "nowhere":  # q right, the cache left as it was
            return self(*rest)[0]
        if self.how == "wrong-slots":
            return super().into_cache(*rest, cache, slots[::-1])
        q = super().into_cache(*rest, cache, slots)
        cache[-1, -1, -1] = cache[-1, -1, -1] + 4  # "stray": one more entry written
        return q


def test_cache_writing_verifier_compares_the_whole_cache():
    for dtype in (mx.float16, mx.bfloat16, mx.float32):
        for tokens, joined in ((1, True), (8, False)):
            assert check_into_cache(OpsHeadPrep("cpu", SPEC, dtype), tokens, joined) == ""
    # One token: reversed slots are the same slot, so every broken kernel is tried at three.
    for how in ("nowhere", "wrong-slots", "stray"):
        assert check_into_cache(_BrokenWrite(SPEC, how), 3, joined=True).startswith("error "), how
    broken = _BrokenWrite(SPEC, "nowhere")
    assert not broken.writes_cache()  # not verified yet: not used (and nothing runs inside a trace)
    assert cache_verified(broken).startswith("1 tokens, joined: error ") and not broken.writes_cache()


def test_add_norm_verifier_passes_the_contract_and_rejects_wrong_kernels():
    class NoResidual(OpsAddNorm):  # the norm of a + b, but the residual stream left out
        def __call__(self, a, b, weight):
            return a, super().__call__(a, b, weight)[1]

    class Unweighted(OpsAddNorm):  # normalized, but the weight never applied
        def __call__(self, a, b, weight):
            return super().__call__(a, b, mx.ones_like(weight))

    for dtype in (mx.float16, mx.bfloat16, mx.float32):
        assert addnorm.verified(OpsAddNorm("cpu", 320, 1e-5, dtype)) == ""
    assert addnorm.check(NoResidual("cpu", 320, 1e-5, mx.bfloat16), 3).startswith("error ")
    assert addnorm.check(Unweighted("cpu", 320, 1e-5, mx.float16), 1).startswith("error ")


def test_kernels_that_cannot_run_are_never_attached(caplog):
    model = _qwen3()
    assert fused.attach(model, "cpu") == {"heads": 0, "norms": 0, "attention": 0}
    if hasattr(mx, "cuda") and mx.cuda.is_available():
        pytest.skip("the CUDA kernels run on this machine (tests/kernels/test_kernels_cuda.py)")
    # Without a CUDA device the kernels raise on their first call: verification fails, nothing is attached.
    assert fused.attach(model, "cuda") == {"heads": 0, "norms": 0, "attention": 0}
    assert all(getattr(layer.self_attn, "head_prep", None) is None for layer in model.model.layers)
    assert all(getattr(layer.input_layernorm, "add_norm", None) is None for layer in model.model.layers)
    assert all(getattr(layer.self_attn, "decode_attention", None) is None for layer in model.model.layers)
    assert "q/k norm and RoPE not used" in caplog.text and "add and norm not used" in caplog.text
    assert "decode attention kernel not used" in caplog.text


def test_qkv_joins_past_the_unfused_limit_only_with_the_head_kernel(monkeypatch):
    model = _qwen3()
    fuse_projections(model)
    monkeypatch.setattr(fwd, "UNFUSED_QKV_MAX_TOKENS", 2)
    attn = model.model.layers[0].self_attn
    joined = []
    real = type(attn.fused_qkv).__call__
    monkeypatch.setattr(type(attn.fused_qkv), "__call__",
                        lambda self, x: (joined.append(x.shape[0]) if self is attn.fused_qkv else None) or real(self, x))
    rows = lambda: [RowInput(tokens=mx.array([5, 17, 42], dtype=mx.int32), n=3,  # noqa: E731
                             kv=RowKV(len(model.model.layers)), sample=True)]
    mx.eval(forward(model, rows()))
    assert joined == []  # 3 tokens > 2 and no head kernel: the parts
    _attach_ops(model, heads=True, norms=False)
    mx.eval(forward(model, rows()))
    assert joined == [3]
