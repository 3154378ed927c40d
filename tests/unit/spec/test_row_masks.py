"""A row's masks for one pass (spec/row.py Row.masks): the K+1 positions' bitmask words in one int32 buffer, each
the constraint's mask after the candidates before it, with the row's constraint where it was afterwards."""

from __future__ import annotations

import json

import pytest
import torch

import specstruct as ss
from specstruct.constraints.base import bitmask_words, pack_mask
from specstruct.spec.row import Step
from specstruct.testing import scripted_engine

VALUE = json.dumps({"name": "Ada", "age": 36})


@pytest.mark.parametrize("kind", ["json", "regex", "text"])
def test_the_k_plus_1_masks_fill_one_words_buffer(kind):
    engine = scripted_engine(VALUE)
    tok = engine.tokenizer
    what = {"json": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                     "required": ["name", "age"]},
            "regex": ss.Regex(r'\{"name": "[A-Za-z]+", "age": [0-9]+\}'), "text": None}[kind]
    constraint = engine.constraint(what)  # None: free text
    row = engine.speculator.row(engine.prompt_ids("go"), constraint, engine.config)
    ids = tok.encode(VALUE, add_special_tokens=False)
    row.constraint.advance(ids[:2])
    step = Step(row.constraint.fork(), budget=16, model_room=0)
    step.add("test", ids[2:10], None)
    before = (row.constraint.mask().clone(), row.stats.mask_time_s)
    out = row.masks(step)
    assert out.dtype == torch.int32 and out.shape == (9, bitmask_words(row.constraint.vocab_size))
    walk = row.constraint.fork()
    for i, words in enumerate(out):
        assert torch.equal(words, pack_mask(walk.mask())), i
        if i < 8:
            assert walk.advance([ids[2 + i]]) == 1
    assert torch.equal(row.constraint.mask(), before[0]) and row.stats.mask_time_s > before[1]
    assert row.constraint.advance(ids[2:]) == len(ids) - 2 and row.constraint.is_final()
