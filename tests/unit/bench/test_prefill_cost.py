"""The prefill probe's plumbing on the tiny model (the figures come from the real target): a cold prefill timed
whole and by parts, the same logits whatever the attention's tile size."""

from __future__ import annotations

import torch

from benchmarks import prefill_cost
from specstruct.runtime import packed
from specstruct.testing import OneSequence, tiny_model, tiny_tokenizer


def test_a_cold_prefill_is_timed_whole_and_by_parts_with_the_same_logits_per_tile_size(monkeypatch):
    rt = OneSequence(tiny_model(tiny_tokenizer(), seed=0))
    logits = {}
    for tile in (1, 8):
        monkeypatch.setattr(packed, "TILE_ROWS", tile)
        seconds, logits[tile] = prefill_cost.prefill(rt, 50, 16)
        assert seconds > 0
    assert torch.equal(logits[1], logits[8])
    parts = prefill_cost.parts(rt, 50, 16)
    assert parts["prefill"] > 0 and {"linear layers", "attention", "kv cache update"} <= set(parts)
    assert abs(sum(v for k, v in parts.items() if k != "prefill") - parts["prefill"]) < 1e-9
