"""Which architectures the row-wise attention is exact for.

Row-wise attention attends every cached key with plain causal scaling, or a layer's sliding window with its
soft-cap where the architecture hands them to the attention function. Each tiny architecture below runs a
prompt plus two short verification blocks through ModelRuntime and through stock SDPA (eager for soft-capping)
over the whole sequence: where `row_invariant_support` says yes the logits agree; where it says no, forcing the
row-wise kernel would give different logits (attention sinks), and the runtime runs stock numerics and records
why."""

from __future__ import annotations

import pytest
import torch
import transformers as tf

from specstruct.runtime import packed, model_runtime as rt
from specstruct.testing import OneSequence

COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64)
EXACT = {
    "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM, {}),
    "qwen2-window-configured-but-off": (tf.Qwen2Config, tf.Qwen2ForCausalLM,
                                        dict(sliding_window=4, use_sliding_window=False)),
    "llama": (tf.LlamaConfig, tf.LlamaForCausalLM, {}),
    "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM, dict(head_dim=8)),
    "mistral-sliding-window": (tf.MistralConfig, tf.MistralForCausalLM, dict(sliding_window=4)),
    "gemma2-softcap": (tf.Gemma2Config, tf.Gemma2ForCausalLM,
                       dict(head_dim=8, sliding_window=4, attn_implementation="eager")),
}
NOT_EXACT = {
    "gpt-oss-sinks": (tf.GptOssConfig, tf.GptOssForCausalLM,
                      dict(head_dim=8, num_local_experts=2, num_experts_per_tok=1, sliding_window=4,
                           layer_types=["full_attention", "full_attention"], attn_implementation="eager"), "sinks"),
}
IDS = [3, 17, 5, 9, 22, 41, 8, 2, 30, 11, 7, 19]


def _model(cfg_cls, model_cls, extra):
    extra = dict(extra)
    attn = extra.pop("attn_implementation", "sdpa")  # the stock reference (soft-capping and sinks need eager)
    torch.manual_seed(0)
    model = model_cls(cfg_cls(**COMMON, **extra)).float().eval()
    for sub in model.modules():
        if hasattr(getattr(sub, "config", None), "_attn_implementation"):
            sub.config._attn_implementation = attn
    return model


@torch.inference_mode()
def _stock(model) -> torch.Tensor:
    return model(input_ids=torch.tensor([IDS])).logits[0].float()


def _runtime(model) -> tuple[torch.Tensor, str]:
    runtime = OneSequence(model)
    rows = [runtime.prefill(IDS[:6]).unsqueeze(0), runtime.extend(IDS[6:9]), runtime.extend(IDS[9:])]
    return torch.cat(rows)[-6:], runtime.numerics


@pytest.mark.parametrize("name", list(EXACT))
def test_row_wise_attention_is_used_where_exact(name):
    cfg_cls, model_cls, extra = EXACT[name]
    model = _model(cfg_cls, model_cls, extra)
    expected = _stock(model)[-6:]
    assert rt.row_invariant_support(model) == (True, "")
    got, numerics = _runtime(model)
    assert "row-invariant" in numerics
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", list(NOT_EXACT))
def test_stock_numerics_with_a_reason_where_row_wise_is_not_exact(name):
    cfg_cls, model_cls, extra, why = NOT_EXACT[name]
    model = _model(cfg_cls, model_cls, extra)
    expected = _stock(model)[-6:]
    ok, reason = rt.row_invariant_support(model)
    assert not ok and why in reason
    got, numerics = _runtime(model)
    assert numerics.startswith("stock") and why in numerics
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)  # stock numerics stay correct
    packed.register_attention()  # the check matters: forcing the row-wise kernel here changes the logits
    for sub in model.modules():
        if hasattr(getattr(sub, "config", None), "_attn_implementation"):
            sub.config._attn_implementation = packed.ATTN_NAME
    runtime = OneSequence(model, row_invariant=False)
    rows = [runtime.prefill(IDS[:6]).unsqueeze(0), runtime.extend(IDS[6:9]), runtime.extend(IDS[9:])]
    forced = torch.cat(rows)[-6:]
    assert not torch.allclose(forced, expected, atol=1e-4, rtol=1e-4)
