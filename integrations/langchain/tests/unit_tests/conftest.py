"""A tiny engine (random-weight Qwen2 over a BPE tokenizer trained in code, plus a perturbed draft) shared by
the unit tests: real specstruct decoding, offline, in milliseconds per token."""

from __future__ import annotations

import functools

import pytest


@functools.lru_cache(maxsize=1)
def tiny_engine():
    import specstruct as ss
    from specstruct.testing import perturbed, tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=0)
    return ss.SpecStruct(model, tok, draft_model=perturbed(model), config=ss.SpecConfig(max_new_tokens=24),
                         model_name="specstruct-tiny")


@pytest.fixture
def engine():
    return tiny_engine()


@pytest.fixture
def chat(engine):
    from langchain_specstruct import ChatSpecStruct

    return ChatSpecStruct(engine=engine, max_tokens=24)
