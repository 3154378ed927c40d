"""Every architecture of runtime/architectures.py through the fused layer and the row-wise attention: tiny
random-weight transformers models (a window smaller than the test sequence, soft-caps small enough to bite, norm
weights away from their initial values) checked against transformers' float model of the same weights, row by row
against a ragged batch (bitwise), and greedy speculative against target-only through the public API."""

from __future__ import annotations

import copy
import dataclasses
import functools

import pytest
import torch
import transformers as tf

import specstruct as ss
from specstruct.runtime import architectures, fused_layer
from specstruct.runtime.model_runtime import ModelRuntime, row_invariant_support
from specstruct.testing import perturbed

COMMON = dict(vocab_size=416, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)
GEMMA = dict(head_dim=16, query_pre_attn_scalar=24, sliding_window=4,
             layer_types=["sliding_attention", "full_attention"] * 2)
ARCHS = {
    "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM, dict(head_dim=16)),
    "llama3": (tf.LlamaConfig, tf.LlamaForCausalLM,
               dict(rope_parameters=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                         original_max_position_embeddings=16, rope_theta=500000.0))),
    "smollm": (tf.LlamaConfig, tf.LlamaForCausalLM, dict(num_key_value_heads=4, tie_word_embeddings=True)),
    "mistral-window": (tf.MistralConfig, tf.MistralForCausalLM, dict(sliding_window=4)),
    "gemma2": (tf.Gemma2Config, tf.Gemma2ForCausalLM,
               dict(GEMMA, attn_logit_softcapping=1.5, final_logit_softcapping=3.0)),
    "gemma3": (tf.Gemma3TextConfig, tf.Gemma3ForCausalLM,
               dict(GEMMA, rope_parameters=dict(sliding_attention=dict(rope_type="default", rope_theta=10000.0),
                                                full_attention=dict(rope_type="linear", factor=2.0,
                                                                    rope_theta=1000000.0)))),
    "phi3": (tf.Phi3Config, tf.Phi3ForCausalLM, dict(sliding_window=5)),
    "phi3-partial-rotary": (tf.Phi3Config, tf.Phi3ForCausalLM, dict(partial_rotary_factor=0.5)),
}
IDS = [5, 9, 20, 33, 41, 7, 8, 60, 3, 17, 22, 2, 30]


@pytest.fixture(scope="module")
def ops():
    ext = fused_layer._KERNEL.load()
    if ext is None:
        pytest.skip(fused_layer._KERNEL.error)
    return ext


def build(name: str, tok=None) -> torch.nn.Module:
    cfg_cls, model_cls, extra = ARCHS[name]
    ids = dict(eos_token_id=tok.eos_token_id if tok else 2, pad_token_id=tok.pad_token_id if tok else 0, bos_token_id=None)
    config = cfg_cls(**{**COMMON, **extra, **ids})
    config._attn_implementation = "eager"  # the reference: soft-capping needs eager
    torch.manual_seed(0)
    model = model_cls(config).float().eval()
    with torch.no_grad():
        for mod_name, p in model.named_parameters():
            if "norm" in mod_name:  # Gemma's norms start at 0 (a weight of 1): move every norm away from its start
                p.add_(torch.randn(p.shape) * 0.3)
            if any(n in mod_name for n in ("q_proj", "k_proj", "qkv_proj")):
                p.mul_(8.0)  # scores of order one, where windows, caps and rotary angles all change the result
        model.get_output_embeddings().weight.mul_(4.0)  # a decisive argmax, as specstruct.testing's models
    return model


@torch.inference_mode()
def reference(model: torch.nn.Module) -> torch.Tensor:
    return model(input_ids=torch.tensor([IDS])).logits[0].float()


@pytest.mark.parametrize("name", list(ARCHS))
def test_fused_runtime_matches_transformers_float_model(ops, name):
    stock = build(name)
    want = reference(stock)
    rt = ModelRuntime(copy.deepcopy(stock))
    assert "fused decoder layers" in rt.numerics and "row-invariant" in rt.numerics, rt.numerics
    assert rt.packed and all("forward" in layer.__dict__ for layer in rt.model.model.layers)
    seq = rt.sequence()  # in three chunks: the cache routed through the packed layout, windows across chunks
    got = torch.cat([rt.forward([(seq, IDS[a:b])], [b - a])[0] for a, b in ((0, 6), (6, 7), (7, len(IDS)))])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", list(ARCHS))
def test_a_row_alone_is_the_same_bits_as_in_a_ragged_batch(ops, name):
    rt = ModelRuntime(build(name))
    alone = rt.forward([(rt.sequence(), IDS)], [len(IDS)])[0]
    other, again = rt.sequence(), rt.sequence()
    rt.forward([(other, [40, 41, 42])], [0])
    batch = rt.forward([(other, [43, 44, 45, 46, 47, 48, 49]), (again, IDS[:9])], [7, 9])
    rest = rt.forward([(again, IDS[9:]), (rt.sequence(), [7] * 11)], [len(IDS) - 9, 11])[0]
    assert torch.equal(torch.cat([batch[1], rest]), alone)


@pytest.mark.parametrize("name", ["qwen3", "llama3", "gemma2", "gemma3", "phi3"])
def test_greedy_speculative_equals_target_only(tok, ops, name):
    target = build(name, tok)
    with ss.SpecStruct(target, tok, draft_model=perturbed(target, noise=0.05)) as engine:
        assert "fused decoder layers" in engine.numerics
        drafted = 0
        for prompt in ["Extract the person: Grace Hopper, 85. Answer with JSON.", "def add(a, b):"]:
            base = engine.run(prompt, max_new_tokens=24, config=ss.SpecConfig(enable_speculative=False))
            spec = engine.run(prompt, max_new_tokens=24, config=ss.SpecConfig(enable_speculative=True))
            assert spec.token_ids == base.token_ids, (name, prompt)
            assert "row-invariant" in spec.stats.numerics
            drafted += spec.stats.drafted
        assert drafted > 0


def test_the_window_and_the_cap_are_computed_not_ignored(ops):
    """Without its window or its soft-cap the row-wise attention gives other logits: the checks above test them."""
    model = build("gemma2")
    want = reference(model)
    rt = ModelRuntime(copy.deepcopy(model))
    fused = [(layer, layer.forward.args[1]) for layer in rt.model.model.layers]
    for change in ({"window": 0}, {"softcap": 0.0}):
        for layer, plan in fused:
            layer.forward = functools.partial(fused_layer.fused_forward, layer, dataclasses.replace(plan, **change))
        got = rt.forward([(rt.sequence(), IDS)], [len(IDS)])[0]
        assert not torch.allclose(got, want, rtol=1e-3, atol=1e-3), change


def test_longrope_picks_each_rows_frequencies_by_its_own_position():
    config = tf.Phi3Config(**{**COMMON, "num_hidden_layers": 1}, pad_token_id=0, original_max_position_embeddings=8,
                           rope_parameters=dict(rope_type="longrope", rope_theta=10000.0, short_factor=[1.0] * 8,
                                                long_factor=[4.0] * 8, original_max_position_embeddings=8))
    model = tf.Phi3ForCausalLM(config).eval()
    assert row_invariant_support(model) == (True, "")
    architectures.per_row_rotary(model)
    rotary, x = model.model.rotary_emb, torch.zeros(1)
    cos, sin = rotary(x, torch.tensor([[3, 12, 7, 8]]))
    for i, pos in enumerate([3, 12, 7, 8]):
        c, s = rotary(x, torch.tensor([[pos]]))
        assert torch.equal(cos[0, i], c[0, 0]) and torch.equal(sin[0, i], s[0, 0])
    stock = type(rotary).forward(rotary, x, torch.tensor([[3, 12]]))[0]  # transformers': by the pass's longest
    assert not torch.equal(cos[0, 0], stock[0, 0])


def test_unsupported_layers_are_named():
    model = build("gemma2")
    model.config.hidden_activation = "relu"
    assert fused_layer.fused_support(model) == (False, "activation 'relu' is not one of ('silu', 'gelu_pytorch_tanh')")
    model = build("mistral-window")
    model.config.model_type = "starcoder2"
    assert row_invariant_support(model) == (False, "a sliding window (4 tokens) is in use")
    model.config.model_type = "mistral"
    model.config.rope_parameters = dict(rope_type="dynamic", factor=2.0, rope_theta=10000.0)
    assert row_invariant_support(model) == (False, "rope type 'dynamic' scales the rotary embedding by the pass's length")
