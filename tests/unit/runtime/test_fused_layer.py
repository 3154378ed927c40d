"""The fused decoder layer (runtime/fused_layer.py, csrc/layer_ops.cpp): transformers' layer computed to float32
precision, each op row-invariant, in use on the runtime for Llama-style models and left out for others."""

import copy

import pytest
import torch

from specstruct.runtime import fused_layer
from specstruct.runtime.model_runtime import ModelRuntime, restore_stock
from specstruct.testing import tiny_llama, tiny_model


@pytest.fixture
def ops():
    ext = fused_layer._KERNEL.load()
    if ext is None:
        pytest.skip(fused_layer._KERNEL.error)
    return ext


def test_the_ops_compute_what_transformers_does(ops):
    gen = torch.Generator().manual_seed(0)
    x, d, w = torch.randn(7, 1536, generator=gen), torch.randn(7, 1536, generator=gen), torch.randn(1536, generator=gen)
    ref = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-6), ref, rtol=1e-5, atol=1e-5)
    s, y = ops.add_rms_norm(x, d, w, 1e-6)
    assert torch.equal(s, x + d)
    torch.testing.assert_close(y, ops.rms_norm(x + d, w, 1e-6), rtol=0, atol=0)
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-6, 1.0), (1 + w) * (ref / w), rtol=1e-4, atol=1e-4)
    s, y = ops.add_rms_norm(x, d, w, 1e-6, 1.0, w + 0.5)  # Gemma: the attention's output normed before the add
    assert torch.equal(s, x + ops.rms_norm(d, w + 0.5, 1e-6, 1.0))
    assert torch.equal(y, ops.rms_norm(s, w, 1e-6, 1.0))
    heads = x[:, :1024].clone()
    ops.head_rms_norm_(heads, w[:128], 1e-6)  # Qwen3's q / k norms: each head of 128 on its own
    torch.testing.assert_close(heads, ops.rms_norm(x[:, :1024].reshape(56, 128).contiguous(), w[:128], 1e-6)
                               .view(7, 1024), rtol=0, atol=0)
    gate, up = x[:, :512], d[:, 512:1024]  # column slices, as of a merged projection's output
    torch.testing.assert_close(ops.gelu_tanh_mul(gate, up),
                               torch.nn.functional.gelu(gate, approximate="tanh") * up, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ops.silu_mul(gate, up), torch.nn.functional.silu(gate) * up, rtol=1e-5, atol=1e-6)
    wide = torch.cat([x, -x]) * 40  # far out on both sides: no overflow, silu(-inf side) = 0, gelu's tanh = +-1
    torch.testing.assert_close(ops.silu_mul(wide, wide), torch.nn.functional.silu(wide) * wide, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ops.gelu_tanh_mul(wide, wide),
                               torch.nn.functional.gelu(wide, approximate="tanh") * wide, rtol=1e-5, atol=1e-5)
    q, k = torch.randn(7, 6 * 128, generator=gen), torch.randn(7, 2 * 128, generator=gen)
    q2, k2 = q.clone(), k.clone()
    part = torch.randn(7, 32, generator=gen)  # a partial rotary embedding: the first 64 floats of each head
    ops.rope_(q2, k2, torch.cat([part.cos()] * 2, -1), torch.cat([part.sin()] * 2, -1), 128)
    assert torch.equal(q2.view(7, 6, 128)[..., 64:], q.view(7, 6, 128)[..., 64:])
    angles = torch.randn(7, 64, generator=gen)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)

    def rotated(t, heads):
        t = t.view(7, heads, 128)
        half = torch.cat((-t[..., 64:], t[..., :64]), dim=-1)
        return (t * cos[:, None] + half * sin[:, None]).reshape(7, -1)

    want_q, want_k = rotated(q, 6), rotated(k, 2)
    ops.rope_(q, k, cos, sin)
    torch.testing.assert_close(q, want_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k, want_k, rtol=1e-5, atol=1e-5)


def test_a_row_is_the_same_bits_alone_or_among_other_rows(ops):
    gen = torch.Generator().manual_seed(1)
    x, d, w = torch.randn(33, 896, generator=gen), torch.randn(33, 896, generator=gen), torch.randn(896, generator=gen)
    whole, (s, y) = ops.rms_norm(x, w, 1e-6), ops.add_rms_norm(x, d, w, 1e-6)
    q, k = torch.randn(33, 14 * 64, generator=gen), torch.randn(33, 2 * 64, generator=gen)
    cos, sin = torch.randn(33, 64, generator=gen), torch.randn(33, 64, generator=gen)
    rq, rk = q.clone(), k.clone()
    ops.rope_(rq, rk, cos, sin)
    acts = ops.silu_mul(x[:, :333], d[:, 7:340]), ops.gelu_tanh_mul(x[:, :333], d[:, 7:340])  # an odd width
    for i in (0, 5, 32):
        assert torch.equal(ops.silu_mul(x[i : i + 1, :333], d[i : i + 1, 7:340])[0], acts[0][i])
        assert torch.equal(ops.gelu_tanh_mul(x[i : i + 1, :333], d[i : i + 1, 7:340])[0], acts[1][i])
        assert torch.equal(ops.rms_norm(x[i : i + 1].clone(), w, 1e-6)[0], whole[i])
        si, yi = ops.add_rms_norm(x[i : i + 1].clone(), d[i : i + 1].clone(), w, 1e-6)
        assert torch.equal(si[0], s[i]) and torch.equal(yi[0], y[i])
        qi, ki = q[i : i + 1].clone(), k[i : i + 1].clone()
        ops.rope_(qi, ki, cos[i : i + 1].clone(), sin[i : i + 1].clone())
        assert torch.equal(qi[0], rq[i]) and torch.equal(ki[0], rk[i])


@pytest.mark.parametrize("build", [tiny_model, tiny_llama], ids=["qwen2", "llama"])
def test_the_runtime_fuses_llama_style_layers_and_matches_transformers(tok, ops, build):
    stock = build(tok)
    rt = ModelRuntime(copy.deepcopy(stock))
    assert "fused decoder layers" in rt.numerics
    assert all("forward" in layer.__dict__ for layer in rt.model.model.layers)
    ids = [5, 9, 20, 33, 41, 7, 8, 60, 3]
    with torch.inference_mode():
        want = stock(input_ids=torch.tensor([ids])).logits[0]
    seq = rt.sequence()
    got = rt.forward([(seq, ids[:4])], [4])[0]  # in two chunks: the cache routed through the packed layout
    got = torch.cat([got, rt.forward([(seq, ids[4:])], [5])[0]])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    restore_stock(rt.model)
    assert not any("forward" in layer.__dict__ for layer in rt.model.model.layers)


def test_a_sequence_is_the_same_bits_alone_or_packed_with_others(tok, ops):
    rt = ModelRuntime(tiny_model(tok, seed=3))
    a, b = list(range(3, 30)), list(range(40, 52))
    alone = rt.forward([(rt.sequence(), a)], [len(a)])[0]
    together = rt.forward([(rt.sequence(), b), (rt.sequence(), a)], [len(b), len(a)])[1]
    assert torch.equal(alone, together)


def test_other_architectures_keep_transformers_layer(tok, monkeypatch):
    model = tiny_model(tok)
    model.config.hidden_act = "gelu"
    assert fused_layer.fused_support(model) == (False, "activation 'gelu' is not one of ('silu', 'gelu_pytorch_tanh')")
    model.config.hidden_act, model.config.model_type = "silu", "gpt_neox"
    assert not fused_layer.fused_support(model)[0] and "gpt_neox" in fused_layer.fused_support(model)[1]
    model.config.model_type = "qwen3"  # a Qwen3 layer has q / k norms
    assert fused_layer.fused_support(model) == (False, "layer 0 is not a qwen3 layer as expected")
    model.config.model_type = "qwen2"
    monkeypatch.setattr(fused_layer._KERNEL, "module", None)
    monkeypatch.setattr(fused_layer._KERNEL, "error", "the decoder layer's small ops could not be built (no compiler)")
    assert fused_layer.fused_support(model) == (False, "the decoder layer's small ops could not be built (no compiler)")
    assert "fused" not in ModelRuntime(model).numerics
