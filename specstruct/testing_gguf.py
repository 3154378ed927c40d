"""Tiny random-weight models of every architecture the runtime computes (runtime/architectures.py), written as bare
GGUF files the way llama.cpp's converter (convert_hf_to_gguf.py) writes a downloaded model: its architecture name,
its hyperparameter keys, its tensor layout (specstruct.testing.write_gguf) and the tokenizer and chat template in
the metadata. Tests load them through the production path and compare with transformers' float model of the same
(de-quantized) weights."""

from __future__ import annotations

import functools
import json
import math

import torch

GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ m['content'] }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

# name -> (transformers model type, config overrides): each trait on where a file can carry it, small enough to bite
# on a short prompt (a window of 4 tokens, soft-caps of a few units)
ARCHS: dict[str, tuple[str, dict]] = {
    "qwen2": ("qwen2", {}),
    # Qwen2.5's long-context rotary: YaRN's blend of interpolated and original frequencies (betas not the defaults)
    "qwen2-yarn": ("qwen2", dict(rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                                      original_max_position_embeddings=64, beta_fast=16.0,
                                                      beta_slow=2.0))),
    "llama3": ("llama", dict(rope_parameters=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                  high_freq_factor=4.0, original_max_position_embeddings=16,
                                                  rope_theta=500000.0))),
    "mistral": ("mistral", dict(sliding_window=None)),  # llama.cpp writes Mistral as "llama": no window key
    "qwen3": ("qwen3", dict(head_dim=16)),
    "gemma2": ("gemma2", dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=4, attn_logit_softcapping=1.5,
                              final_logit_softcapping=3.0, tie_word_embeddings=True)),
    "gemma3": ("gemma3_text", dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=4, num_hidden_layers=6,
                                   tie_word_embeddings=True,
                                   rope_parameters=dict(sliding_attention=dict(rope_type="default", rope_theta=10000.0),
                                                        full_attention=dict(rope_type="linear", factor=2.0,
                                                                            rope_theta=1000000.0)))),
    "phi3": ("phi3", dict(sliding_window=5, partial_rotary_factor=0.5)),
    # Phi-3.5 / Phi-4-mini's rotary: the long factors past 16 positions (each row by its own position)
    "phi3-longrope": ("phi3", dict(original_max_position_embeddings=16, rope_parameters=dict(
        rope_type="longrope", rope_theta=10000.0, original_max_position_embeddings=16,
        short_factor=[1.0, 1.0, 1.125, 1.25, 1.5, 2.0, 3.0, 4.0], long_factor=[1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 12.0, 16.0]))),
}


@functools.lru_cache(maxsize=4)
def tiny_spm_tokenizer(vocab_size: int = 300, space_prefix: bool = False):
    """A sentencepiece-style BPE tokenizer as Gemma's (spaces as "▁", byte fallback to <0x00>..<0xFF>, <pad>
    <eos> <bos> <unk> first, <start_of_turn> / <end_of_turn>), trained in code on specstruct.testing's corpus: what
    llama.cpp's converter writes as a "llama" vocabulary (write_bare_gguf). `space_prefix`: a "▁" before the text,
    as Llama 2's and Phi-3's sentencepiece models add (add_dummy_prefix), not Gemma's."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers
    from transformers import PreTrainedTokenizerFast

    from specstruct.testing import _CORPUS

    special = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    trained = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    normalizer = [normalizers.Prepend("▁")] if space_prefix else []
    trained.normalizer = normalizers.Sequence([*normalizer, normalizers.Replace(" ", "▁")])
    trained.train_from_iterator(_CORPUS * 4, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special,
                                                                 show_progress=False))
    model = json.loads(trained.to_str())["model"]
    pieces = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1]) if t not in special]
    tokens = special + [f"<0x{b:02X}>" for b in range(256)] + pieces  # sentencepiece's order
    merges = [tuple(m) if not isinstance(m, str) else tuple(m.split(" ")) for m in model["merges"]]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, unk_token="<unk>",
                               byte_fallback=True))
    tok.normalizer = normalizers.Sequence([*normalizer, normalizers.Replace(" ", "▁")])
    strip = [decoders.Strip(" ", 1, 0)] if space_prefix else []
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), *strip])
    tok.add_special_tokens(special)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<end_of_turn>",
                                   unk_token="<unk>", pad_token="<pad>")
    fast.chat_template = GEMMA_TEMPLATE
    fast.name_or_path = f"specstruct-tiny-spm-{vocab_size}{'-prefix' if space_prefix else ''}"
    return fast


def tiny_arch(name: str, tokenizer=None, seed: int = 0, hidden: int = 64, layers: int = 2, heads: int = 4):
    """A random-weight causal LM of ARCHS[name] over `tokenizer` (default specstruct.testing.tiny_tokenizer): 4
    heads of 16 dimensions by default (2 for keys and values), norms away from their initial weights, q / k scaled so scores
    are of order one (windows, caps and rotary angles then change the result) and a decisive LM head."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from specstruct.testing import tiny_tokenizer

    tokenizer = tokenizer or tiny_tokenizer()
    model_type, extra = ARCHS[name]
    # Gemma 3's converter cuts the embedding to the tokenizer's rows: no padding rows there
    vocab = len(tokenizer) if model_type == "gemma3_text" else (len(tokenizer) + 7) // 8 * 8 + 8
    config = AutoConfig.for_model(model_type, **{
        "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": hidden * 2, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": 2, "max_position_embeddings": 256,
        "tie_word_embeddings": False, "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": None, **extra})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for param_name, p in model.named_parameters():
            if "norm" in param_name:
                p.add_(torch.randn(p.shape) * 0.3)
            if any(n in param_name for n in ("q_proj", "k_proj", "qkv_proj")):
                p.mul_(4.0)
        model.get_output_embeddings().weight.mul_(4.0)
    return model


def write_bare_gguf(model, tokenizer, path, quant: str = "Q8_0", name: str = "tiny"):
    """`model` as a bare GGUF file: write_gguf's tensors plus the key-values llama.cpp's converter writes for its
    architecture (hyperparameters, the byte-level BPE tokenizer padded to the vocabulary with [PAD] tokens, special
    token ids, the chat template). Returns the float32 model the file's weights stand for."""
    from specstruct.testing import write_gguf

    return write_gguf(model, path, quant, metadata=lambda writer: _metadata(writer, model.config, tokenizer, name))


def _metadata(writer, cfg, tokenizer, name: str) -> None:
    """The key-values of llama.cpp's converter for `cfg`'s architecture (conversion/{llama,qwen,gemma,phi}.py)."""
    writer.add_name(name)
    kind = cfg.model_type
    head_dim = cfg.to_dict().get("head_dim") or cfg.hidden_size // cfg.num_attention_heads
    params = cfg.to_dict().get("rope_parameters") or {}
    full = params.get("full_attention", params)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if kind == "phi3":  # Phi3MiniModel: a rotary width in dimensions, the window (0: none)
        writer.add_rope_scaling_orig_ctx_len(cfg.original_max_position_embeddings)
        writer.add_rope_dimension_count(int(params.get("partial_rotary_factor", 1.0) * cfg.hidden_size)
                                        // cfg.num_attention_heads)
        writer.add_rope_freq_base(full["rope_theta"])
        writer.add_sliding_window(cfg.sliding_window or 0)
        if params.get("long_factor"):
            scale = cfg.max_position_embeddings / cfg.original_max_position_embeddings
            writer.add_rope_scaling_attn_factors(
                math.sqrt(1 + math.log(scale) / math.log(cfg.original_max_position_embeddings)) if scale > 1 else 1.0)
    else:
        if kind != "gemma2":  # TextModel's keys (Gemma2Model writes its own, without the rotary base)
            from gguf import RopeScalingType

            if full.get("rope_type") == "linear":
                writer.add_rope_scaling_type(RopeScalingType.LINEAR)
                writer.add_rope_scaling_factor(full["factor"])
            elif full.get("rope_type") == "yarn":
                writer.add_rope_scaling_type(RopeScalingType.YARN)
                writer.add_rope_scaling_factor(full["factor"])
                writer.add_rope_scaling_orig_ctx_len(full["original_max_position_embeddings"])
                if full.get("attention_factor") is not None:
                    writer.add_rope_scaling_yarn_attn_factor(full["attention_factor"])
                if full.get("beta_fast") is not None:
                    writer.add_rope_scaling_yarn_beta_fast(full["beta_fast"])
                if full.get("beta_slow") is not None:
                    writer.add_rope_scaling_yarn_beta_slow(full["beta_slow"])
            writer.add_rope_freq_base(full["rope_theta"])
            if "sliding_attention" in params:
                writer.add_rope_freq_base_swa(params["sliding_attention"]["rope_theta"])
        if "head_dim" in cfg.to_dict() or kind.startswith("gemma"):
            writer.add_key_length(head_dim)
            writer.add_value_length(head_dim)
    if kind in ("llama", "mistral"):  # LlamaModel
        writer.add_vocab_size(cfg.vocab_size)
        writer.add_rope_dimension_count(head_dim)
    if kind == "gemma2":
        writer.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        writer.add_final_logit_softcapping(cfg.final_logit_softcapping)
    if kind.startswith("gemma"):
        if cfg.final_logit_softcapping and kind != "gemma2":
            writer.add_final_logit_softcapping(cfg.final_logit_softcapping)
        writer.add_sliding_window(cfg.sliding_window)
    _tokenizer(writer, tokenizer, cfg.vocab_size)


def _tokenizer(writer, tokenizer, vocab_size: int) -> None:
    """The tokenizer as the converter writes it: a byte-level BPE vocabulary as _set_vocab_gpt2 does (the tokens by
    id, padded to the model's vocabulary with [PAD<id>] tokens (unused), the control tokens marked, the merges), a
    sentencepiece one (tiny_spm_tokenizer) as _set_vocab_sentencepiece does (tokens, scores and types, no merges);
    the special ids and the chat template."""
    vocab = tokenizer.backend_tokenizer.get_vocab(with_added_tokens=True)
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    if len(tokens) > vocab_size:
        raise ValueError(f"the tokenizer has {len(tokens)} tokens, the model {vocab_size} rows")
    if json.loads(tokenizer.backend_tokenizer.to_str())["model"].get("byte_fallback"):
        _sentencepiece(writer, tokenizer, tokens, vocab_size)
        return
    special = set(tokenizer.all_special_tokens) | {"<|im_start|>", "<|im_end|>", "<|endoftext|>"}
    types = [3 if t in special else 1 for t in tokens]  # CONTROL, NORMAL
    pads = range(len(tokens), vocab_size)
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens + [f"[PAD{i}]" for i in pads])
    writer.add_token_types(types + [5] * len(pads))  # UNUSED
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(tokenizer.chat_template)


def _sentencepiece(writer, tokenizer, tokens: list[str], vocab_size: int) -> None:
    special = set(tokenizer.all_special_tokens) | {"<start_of_turn>", "<end_of_turn>"}

    def kind(token: str) -> int:  # SentencePieceTokenTypes
        if token == tokenizer.unk_token:
            return 2
        if token in special:
            return 3
        return 6 if token.startswith("<0x") and len(token) == 6 else 1

    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    pads = range(len(tokens), vocab_size)  # the model's rows past the tokenizer's: [PAD<id>], unused
    writer.add_token_list(tokens + [f"[PAD{i}]" for i in pads])
    writer.add_token_scores([0.0 if kind(t) != 1 else -float(i) for i, t in enumerate(tokens)] + [-10000.0] * len(pads))
    writer.add_token_types([kind(t) for t in tokens] + [5] * len(pads))
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_unk_token_id(tokenizer.unk_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix('"Prepend"' in tokenizer.backend_tokenizer.to_str())  # add_dummy_prefix
    writer.add_chat_template(tokenizer.chat_template)
