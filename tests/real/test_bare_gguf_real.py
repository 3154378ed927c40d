"""The shipped target's GGUF file given bare (nothing beside it): config, tokenizer and chat template from its own
metadata, the same as the pulled folder's; the registry draft chosen by vocabulary; a typed extraction lossless."""

from __future__ import annotations

import os
import time

import pytest
import torch
from pydantic import BaseModel

import specstruct as ss
from specstruct import models, settings
from specstruct.models.registry import GGUF_NAME


class Person(BaseModel):
    name: str
    age: int
    city: str


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """The target's GGUF file alone in a folder (a link to the pulled file), and an empty metadata cache."""
    folder = tmp_path_factory.mktemp("bare")
    path = folder / "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf"
    os.symlink(models.model_dir(models.DEFAULT_TARGET) / GGUF_NAME, path)
    cache = tmp_path_factory.mktemp("cache")
    before = os.environ.get("SPECSTRUCT_CACHE")
    os.environ["SPECSTRUCT_CACHE"] = str(cache)
    settings.cache_clear()
    yield path
    if before is None:
        os.environ.pop("SPECSTRUCT_CACHE", None)
    else:
        os.environ["SPECSTRUCT_CACHE"] = before
    settings.cache_clear()


def test_the_bare_files_metadata_is_the_pulled_folders_and_is_read_from_the_cache_after(bare):
    from transformers import AutoConfig, AutoTokenizer

    from specstruct.models.bare_gguf import metadata_folder

    folder = metadata_folder(bare)  # converted from the file's metadata (20-40 s)
    t0 = time.perf_counter()
    assert metadata_folder(bare) == folder
    assert time.perf_counter() - t0 < 5  # the header digest only
    pulled = models.model_dir(models.DEFAULT_TARGET)
    ours, theirs = AutoTokenizer.from_pretrained(str(folder)), AutoTokenizer.from_pretrained(str(pulled))
    assert ours.get_vocab() == theirs.get_vocab() and ours.chat_template == theirs.chat_template
    text = 'Extract: {"name": "Grace Hopper", "age": 85} <|im_end|>'
    assert ours.encode(text) == theirs.encode(text)
    a, b = AutoConfig.from_pretrained(str(folder)), AutoConfig.from_pretrained(str(pulled))
    for key in ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "vocab_size", "rms_norm_eps", "max_position_embeddings", "eos_token_id"):
        assert getattr(a, key) == getattr(b, key), key


def test_a_bare_target_picks_the_registry_draft_by_vocabulary_and_extracts_losslessly(bare):
    torch.set_num_threads(os.cpu_count() or 2)
    engine = ss.SpecStruct.from_pretrained(str(bare), draft="auto")
    assert engine.draft_model is not None  # qwen2.5-coder-0.5b: the same 151,936-token vocabulary
    assert "Q4_K" in engine.numerics and "row-invariant" in engine.numerics
    prompt = "Extract the person: Grace Hopper, 85, lived in Arlington."
    spec = engine.run(prompt, Person)
    base = engine.run(prompt, Person, config=engine.config.merged(enable_speculative=False))
    assert spec.value == Person(name="Grace Hopper", age=85, city="Arlington")
    assert spec.token_ids == base.token_ids
