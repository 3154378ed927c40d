"""Batch invariance on tiny random models over a real byte-level BPE tokenizer.

A row's logits are bitwise the same alone or packed with other rows (and however its prompt is chunked); so
batched greedy output == the same request decoded alone, token for token, for mixed output types, rows that
finish at different steps, rows admitted mid-flight, a draft that disagrees often and no draft; seeded sampling
is the same whatever the batch; a failing row fails alone."""

from __future__ import annotations

import random

import pytest
import torch

from specstruct.config import SpecConfig
from specstruct.spec.batch import BatchDecoder
from specstruct.runtime.model_runtime import quantize_draft

from test_speculative import PROMPTS, SPECS, _compile, _engine
from specstruct.testing import OneSequence, run_alone

KINDS = list(SPECS)  # json, regex, choice, grammar, text, code


def _ids(tok, prompt):
    return tok.encode(prompt, add_special_tokens=False)


def test_row_logits_are_bitwise_the_same_alone_or_packed(tok, target):
    rt = OneSequence(target)
    rng = random.Random(0)
    prompts = [_ids(tok, p) for p in PROMPTS] + [_ids(tok, p)[:n] for p, n in zip(PROMPTS, (5, 9, 17, 3))]
    mine = _ids(tok, PROMPTS[1])
    feed = [rng.randrange(len(tok)) for _ in range(4)]

    def row_logits(others: list[list[int]], chunk: int):
        seq = rt.sequence()
        pos = 0
        while pos < len(mine):  # my prompt in chunks, each packed with the other rows' prompts
            segs = [(seq, mine[pos : pos + chunk])] + [(rt.sequence(), o) for o in others]
            rt.forward(segs, [0] + [1] * len(others))
            pos += chunk
        segs = [(seq, feed)] + [(rt.sequence(), o) for o in others]
        return rt.forward(segs, [len(feed)] + [len(o) for o in others])[0]

    alone = row_logits([], len(mine))
    for n in range(1, 8):
        others = rng.sample(prompts, n)
        got = row_logits(others, rng.choice([1, 3, 7, len(mine)]))
        assert torch.equal(got, alone), n


def _alone(eng, tok, kind, prompt, cfg):
    return run_alone(eng.row(_ids(tok, prompt), _compile(tok, eng, kind).fork(), cfg)).token_ids


@pytest.mark.parametrize("draft_kind", ["close-int8", "far", "none"])
def test_batched_greedy_equals_alone_for_mixed_rows(tok, target, close_draft, far_draft, draft_kind):
    draft = {"close-int8": quantize_draft(close_draft), "far": far_draft, "none": None}[draft_kind]
    eng = _engine(tok, target, draft)
    jobs = [(kind, PROMPTS[i % len(PROMPTS)], SpecConfig(max_new_tokens=12 + 5 * i)) for i, kind in enumerate(KINDS)]
    jobs += [("json", PROMPTS[1], SpecConfig(max_new_tokens=40)), ("text", PROMPTS[2], SpecConfig(max_new_tokens=9))]
    expected = [_alone(eng, tok, k, p, c) for k, p, c in jobs]
    batch = BatchDecoder(eng, prefill_chunk=8)
    rows = [eng.row(_ids(tok, p), _compile(tok, eng, k).fork(), c) for k, p, c in jobs]
    pending, steps, finished_at, sizes = list(rows), 0, {}, []
    streamed = {id(r): [] for r in rows}
    while pending or len(batch):
        if pending and (steps % 2 == 0):  # admit mid-flight, one row every other step
            batch.add(pending.pop(0))
        sizes.append(len(batch))
        for row, toks, done in batch.step():
            streamed[id(row)] += toks
            if done:
                finished_at[id(row)] = steps
        steps += 1
    assert max(sizes) >= 4
    assert len(set(finished_at.values())) > 1  # rows finished at different steps
    for row, want in zip(rows, expected):
        assert row.error is None
        assert row.token_ids == want == streamed[id(row)], row.stats.mode
        assert row.stats.batch_rows > 1.0


@pytest.mark.parametrize("draft_kind", ["close-int8", "close"])
def test_seeded_sampling_is_the_same_whatever_the_batch(tok, target, close_draft, draft_kind):
    draft = quantize_draft(close_draft) if draft_kind == "close-int8" else close_draft
    eng = _engine(tok, target, draft)
    cfg = SpecConfig(temperature=1.0, seed=7, max_new_tokens=24)
    alone = _alone(eng, tok, "json", PROMPTS[0], cfg)
    for company in (1, 3):
        batch = BatchDecoder(eng, prefill_chunk=5)
        mine = eng.row(_ids(tok, PROMPTS[0]), _compile(tok, eng, "json").fork(), cfg)
        others = [eng.row(_ids(tok, PROMPTS[(i + 1) % 4]), _compile(tok, eng, KINDS[i]).fork(),
                             SpecConfig(temperature=0.8 * (i % 2), max_new_tokens=16)) for i in range(company)]
        batch.add(others[0])
        batch.step()
        batch.add(mine)
        for o in others[1:]:
            batch.add(o)
        while len(batch):
            batch.step()
        assert mine.token_ids == alone, company


def test_a_failing_row_fails_alone(tok, target, close_draft):
    eng = _engine(tok, target, close_draft)
    cfg = SpecConfig(max_new_tokens=20)
    want = _alone(eng, tok, "json", PROMPTS[1], cfg)
    good = eng.row(_ids(tok, PROMPTS[1]), _compile(tok, eng, "json").fork(), cfg)
    bad = eng.row(_ids(tok, PROMPTS[0]), _compile(tok, eng, "json").fork(), cfg)
    batch = BatchDecoder(eng)
    batch.add(good)
    batch.add(bad)
    batch.step()

    def broken(tokens):
        raise ValueError("constraint broke")

    bad.constraint.inner.advance = broken  # its next commit raises inside the batch step
    while len(batch):
        batch.step()
    assert bad.finish_reason == "error" and isinstance(bad.error, ValueError)
    assert good.error is None and good.token_ids == want


def test_cancelled_row_frees_its_caches(tok, target, close_draft):
    eng = _engine(tok, target, close_draft)
    cfg = SpecConfig(max_new_tokens=30)
    rows = [eng.row(_ids(tok, p), _compile(tok, eng, "json").fork(), cfg) for p in PROMPTS[:2]]
    batch = BatchDecoder(eng)
    for r in rows:
        batch.add(r)
    batch.step()
    batch.step()
    batch.remove(rows[0])
    assert len(batch) == 1 and rows[0].kv is None and rows[0].draft_kv is None
    assert rows[0].stats.new_tokens == len(rows[0].token_ids)
    while len(batch):
        batch.step()
    assert rows[1].finish_reason in ("stop", "length") and rows[1].kv is None


@pytest.mark.parametrize("adaptive", [True, False])
def test_prefill_budget_grows_for_a_burst_of_prompts_only(tok, target, close_draft, adaptive):
    """prefill_budget.py in the decoder, with the real pair's pass costs (fixed, not measured: tiny models cost
    almost nothing per token): 1 prompt joining 1 decoding row is read `prefill_chunk` tokens a step; 4 more
    arriving are read faster (unless adaptive_prefill=False). Every output is the request's output alone."""
    eng = _engine(tok, target, close_draft)
    cfg = SpecConfig(max_new_tokens=24, use_prefix_cache=False)
    jobs = [(KINDS[i], PROMPTS[i % 4] + " " + PROMPTS[(i + 1) % 4]) for i in range(6)]
    expected = [_alone(eng, tok, k, p, cfg) for k, p in jobs]
    eng.policy.use_timing = False  # the costs below stay as they are
    eng.policy.target_cost = {n: 0.45 + 0.022 * n for n in (1, 2, 4, 8, 16, 32, 64, 128, 256, 300)}
    rows = [eng.row(_ids(tok, p), _compile(tok, eng, k).fork(), cfg) for k, p in jobs]
    batch = BatchDecoder(eng, prefill_chunk=32, adaptive_prefill=adaptive)

    def read_in_one_step(newcomers):  # prompt tokens all prefilling rows read in the next step
        for r in newcomers:
            batch.add(r)
        before = sum(r.prefilled for r in rows[1:])
        batch.step()
        return sum(r.prefilled for r in rows[1:]) - before

    batch.add(rows[0])
    while rows[0].prefilling:
        batch.step()
    assert len(rows[1].prompt) > 40
    assert read_in_one_step(rows[1:2]) == 32  # one prompt joining one decoding row: latency first
    burst = read_in_one_step(rows[2:])
    assert burst > 32 if adaptive else burst == 32
    while len(batch):
        batch.step()
    assert [r.token_ids for r in rows] == expected and all(r.error is None for r in rows)
