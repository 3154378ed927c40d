"""The tiny engine the unit tests share: a random-weight Qwen2 over a BPE tokenizer trained in code, plus a
perturbed copy as its draft model. Real specstruct decoding, offline, milliseconds per token."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def tiny_engine():
    import specstruct as ss
    from specstruct.testing import perturbed, tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=0)
    return ss.SpecStruct(model, tok, draft_model=perturbed(model), config=ss.SpecConfig(max_new_tokens=24),
                         model_name="specstruct-tiny")


@functools.lru_cache(maxsize=1)
def marker_tokenizer():
    """The tiny tokenizer plus Qwen2.5's tool-call markers as added (non-special) tokens, like the real one."""
    import copy

    from specstruct.testing import tiny_tokenizer

    tok = copy.deepcopy(tiny_tokenizer())
    tok.add_tokens(["<tool_call>", "</tool_call>"])
    return tok


@functools.lru_cache(maxsize=1)
def tiny_marker_engine():
    """A tiny engine whose tokenizer has `<tool_call>` tokens (the real Qwen2.5 situation)."""
    import specstruct as ss
    from specstruct.testing import tiny_model

    tok = marker_tokenizer()
    return ss.SpecStruct(tiny_model(tok, seed=0), tok, config=ss.SpecConfig(max_new_tokens=24),
                         model_name="specstruct-tiny-markers")
