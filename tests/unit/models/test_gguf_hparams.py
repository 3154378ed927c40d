"""models/gguf_hparams.py on the keys llama.cpp reads and the tiny files of test_architectures_gguf do not carry:
the 27B Gemmas' query scale, a Gemma 3 without a window, a per-layer window pattern, linear rope scaling, YaRN's keys
in each form a file has them, an architecture with nothing missing. The files hold metadata only (gguf's GGUFWriter)."""

from __future__ import annotations

import pytest

from specstruct.models.gguf_hparams import hparams

gguf = pytest.importorskip("gguf")


def _file(path, arch: str, layers: int = 4, hidden: int = 64, heads: int = 4, **keys):
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(layers)
    writer.add_embedding_length(hidden)
    writer.add_head_count(heads)
    for key, value in keys.items():
        if isinstance(value, list):
            writer.add_array(f"{arch}.{key}", value)
        elif isinstance(value, str):
            writer.add_string(f"{arch}.{key}", value)
        elif isinstance(value, float):
            writer.add_float32(f"{arch}.{key}", value)
        else:
            writer.add_uint32(f"{arch}.{key}", value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_27b_gemmas_scale_queries_by_hidden_over_heads_as_llama_cpp_does(tmp_path):
    for arch, layers in (("gemma2", 46), ("gemma3", 62)):
        big = hparams(_file(tmp_path / f"{arch}.gguf", arch, layers=layers, hidden=4608, heads=32,
                            **{"attention.key_length": 128, "attention.sliding_window": 4096}))
        assert big["query_pre_attn_scalar"] == 144 and big["head_dim"] == 128
        small = hparams(_file(tmp_path / f"{arch}-small.gguf", arch, layers=layers - 2, hidden=4608, heads=32,
                              **{"attention.key_length": 128, "attention.sliding_window": 4096}))
        assert small["query_pre_attn_scalar"] == 128


def test_a_gemma3_without_a_window_attends_globally_everywhere(tmp_path):
    got = hparams(_file(tmp_path / "g.gguf", "gemma3", layers=6, **{"attention.key_length": 16}))
    assert got["sliding_window"] is None and got["layer_types"] == ["full_attention"] * 6
    assert got["final_logit_softcapping"] is None


def test_a_stated_window_pattern_sets_each_layer(tmp_path):
    flags = hparams(_file(tmp_path / "a.gguf", "gemma3", layers=3, **{
        "attention.sliding_window": 8, "attention.sliding_window_pattern": [True, False, True]}))
    assert flags["layer_types"] == ["sliding_attention", "full_attention", "sliding_attention"]
    every = hparams(_file(tmp_path / "n.gguf", "gemma2", layers=6, **{
        "attention.sliding_window": 8, "attention.sliding_window_pattern": 3}))
    assert every["layer_types"] == ["sliding_attention", "sliding_attention", "full_attention"] * 2


def test_linear_rope_scaling_is_kept_and_an_architecture_with_nothing_missing_gets_nothing(tmp_path):
    got = hparams(_file(tmp_path / "q.gguf", "qwen2", **{"rope.scaling.type": "linear", "rope.scaling.factor": 4.0,
                                                          "rope.freq_base": 1000000.0}))
    assert got == {"rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0}}
    assert hparams(_file(tmp_path / "plain.gguf", "qwen2")) == {}
    assert hparams(_file(tmp_path / "other.gguf", "starcoder2")) == {}


def test_yarn_scaling_is_read_as_qwen_files_carry_it(tmp_path):
    """Qwen2.5's long-context files: the type, factor and original context (the betas and attention factor left
    to transformers' defaults, 32, 1 and 0.1 ln(factor) + 1, which are llama.cpp's)."""
    got = hparams(_file(tmp_path / "q.gguf", "qwen2", **{
        "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 32768,
        "rope.freq_base": 1000000.0, "context_length": 131072}))
    assert got == {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1000000.0,
                                       "original_max_position_embeddings": 32768}}


def test_yarn_betas_and_attention_factor_where_the_converter_wrote_them(tmp_path):
    got = hparams(_file(tmp_path / "q3.gguf", "qwen3", **{
        "rope.scaling.type": "yarn", "rope.scaling.factor": 2.0, "rope.scaling.original_context_length": 4096,
        "rope.scaling.yarn_beta_fast": 16.0, "rope.scaling.yarn_beta_slow": 2.0,
        "rope.scaling.yarn_attn_factor": 0.5, "attention.key_length": 128}))["rope_parameters"]
    assert got == {"rope_type": "yarn", "factor": 2.0, "rope_theta": 10000.0, "original_max_position_embeddings": 4096,
                   "beta_fast": 16.0, "beta_slow": 2.0, "attention_factor": 0.5}


def test_yarn_without_an_original_context_uses_the_training_one_and_attn_factor_multiplies(tmp_path):
    """llama.cpp: n_ctx_orig_yarn defaults to the training context; `rope.scaling.attn_factor` multiplies YaRN's
    own magnitude scale."""
    import math

    got = hparams(_file(tmp_path / "l.gguf", "llama", **{
        "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "context_length": 8192,
        "rope.scaling.attn_factor": 0.5}))["rope_parameters"]
    assert got["original_max_position_embeddings"] == 8192
    assert got["attention_factor"] == pytest.approx((0.1 * math.log(4.0) + 1.0) * 0.5)
    assert hparams(_file(tmp_path / "one.gguf", "qwen2", **{"rope.scaling.type": "yarn"})) == {}  # no factor: none
