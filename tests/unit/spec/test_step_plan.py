"""A decode step as plan -> execute -> apply: the planner and the applier on fakes, without any model.

The planner must say everything the target pass does (rows, tokens, masks, KV) without running it; the applier
must turn a pass's logits into commits, costs, stats and prefix-cache entries in one place."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from specstruct.config import SpecConfig
from specstruct.spec.batch import BatchDecoder
from specstruct.spec.interfaces import Draft, Setup, Sizing, Traits
from specstruct.spec.proposers import registry
from specstruct.spec.speculator import Speculator
from specstruct.spec.step_plan import Prefill, StepPlan, StepResult
from specstruct.testing import tiny_tokenizer

TOK = tiny_tokenizer()
V, EOS = len(TOK), TOK.eos_token_id
QUIET = SpecConfig(max_new_tokens=8, enable_speculative=False)


class Free:
    """A constraint that allows every token and is never final (text mode)."""

    mode, vocab_size = "text", V

    def __init__(self, n: int = 0):
        self.n = n

    def mask(self) -> torch.Tensor:
        return torch.ones(V, dtype=torch.bool)

    def advance(self, tokens) -> int:
        self.n += len(tokens)
        return len(tokens)

    def rollback(self, n: int) -> None:
        self.n -= n

    def forced_text(self) -> str:
        return ""

    def is_final(self) -> bool:
        return False

    def fork(self) -> "Free":
        return Free(self.n)

    def accepts(self, text: str) -> bool:
        return True


class Seq:
    def __init__(self, length: int = 0):
        self.length = length

    def crop(self, length: int) -> None:
        self.length = length

    def layers(self) -> list:
        return []

    def views(self) -> list:
        return []


class NoModel:
    """A runtime the planner and the applier must never run."""

    vocab_size, numerics, cache_key = V, "fake", "fake"
    row_invariant, packed, reuses_prefixes = True, False, False
    max_length = None

    def sequence(self, layers=None, length: int = 0) -> Seq:
        return Seq(length)

    def forward(self, segments, keep, masks=None):
        raise AssertionError("the planner and the applier run no model")


class Hit:
    tokens, layers = 0, None

    def release(self) -> None:
        pass


class RecordingCache:
    enabled = True

    def __init__(self):
        self.inserted: list[tuple[object, list[int]]] = []

    def lookup(self, namespace, ids, **_):
        return Hit()

    def insert(self, namespace, ids, layers) -> None:
        self.inserted.append((namespace, list(ids)))


def logits_choosing(*tokens: int) -> torch.Tensor:
    out = torch.zeros(len(tokens), V)
    for i, t in enumerate(tokens):
        out[i, t] = 10.0
    return out


@pytest.fixture
def speculator() -> Speculator:
    return Speculator(NoModel(), TOK, [EOS], config=QUIET)


def test_the_plan_says_what_the_pass_does_and_is_frozen(speculator):
    batch = BatchDecoder(speculator, prefill_chunk=4, adaptive_prefill=False)
    a = speculator.row([1, 2, 3], Free(), QUIET)
    batch.add(a)
    plan = batch.plan()
    assert plan.verify == () and plan.prefill == (Prefill(a, a.kv, (1, 2, 3), keep=1),)  # alone: the whole prompt
    assert plan.segments() == [(a.kv, (1, 2, 3))] and plan.keep() == [1] and plan.masks() == [None]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.verify = ()  # type: ignore[misc]

    assert batch.apply(plan, StepResult((logits_choosing(7),), 0.01)) == [(a, [7], False)]
    b = speculator.row(list(range(1, 11)), Free(), QUIET)
    batch.add(b)
    plan = batch.plan()
    (v,) = plan.verify
    assert (v.row, v.kv, v.feed, len(v.masks), v.proposal.tokens) == (a, a.kv, (7,), 1, ())
    assert plan.prefill == (Prefill(b, b.kv, (1, 2, 3, 4), keep=0),)  # beside a decoding row: the chunk's floor
    assert plan.entries == (v, *plan.prefill) and plan.tokens == 5


def test_proposals_and_masks_line_up_with_the_feed(speculator):
    batch = BatchDecoder(speculator)
    cfg = SpecConfig(max_new_tokens=16, use_draft_model=False)
    tok = speculator.tokenizer
    text = tok.encode('{"name": "Ada Lovelace"} {"name": "Ada', add_special_tokens=False)
    row = speculator.row(text, Free(), cfg)
    batch.add(row)
    batch.apply(batch.plan(), StepResult((logits_choosing(text[-1]),), 0.01))
    (v,) = batch.plan().verify
    assert v.feed == (row.token_ids[-1], *v.proposal.tokens) and len(v.masks) == len(v.feed)
    assert sum(n for _, n in v.proposal.segments) == len(v.proposal.tokens)


def test_apply_commits_accepts_and_records_costs_stats_and_the_prefix_cache(speculator):
    speculator.prefix_cache = RecordingCache()
    speculator.target.reuses_prefixes = True
    batch = BatchDecoder(speculator)
    a = speculator.row([1, 2, 3], Free(), QUIET)
    batch.add(a)
    plan = batch.plan()
    batch.apply(plan, StepResult((logits_choosing(7),), 0.5))
    assert speculator.prefix_cache.inserted == [((speculator.target.cache_key, None), [1, 2, 3])]
    assert speculator.policy.target_cost[3] == 0.5 and a.stats.target_forwards == 1 and a.token_ids == [7]

    plan = batch.plan()
    assert batch.apply(plan, StepResult((logits_choosing(EOS),), 0.25)) == [(a, [], True)]
    assert a.finish_reason == "stop" and a.stats.verify_time_s == 0.25 and len(batch) == 0


def test_a_failed_pass_fails_its_rows_alone(speculator):
    batch = BatchDecoder(speculator, prefill_chunk=2, adaptive_prefill=False)
    a, b = speculator.row([1, 2, 3], Free(), QUIET), speculator.row([4, 5], Free(), QUIET)
    batch.add(a)
    batch.apply(batch.plan(), StepResult((logits_choosing(7),), 0.01))
    batch.add(b)
    plan = batch.plan()
    err = RuntimeError("the pass broke")
    assert batch.apply(plan, StepResult(error=err)) == [(a, [], True), (b, [], True)]
    assert a.error is err and b.finish_reason == "error" and len(batch) == 0


def test_an_empty_plan_runs_nothing(speculator):
    batch = BatchDecoder(speculator)
    plan = batch.plan()
    assert plan == StepPlan(rows=(), started=plan.started) and batch.execute(plan) == StepResult()
    assert batch.apply(plan, StepResult()) == []


class Echo:
    """A proposer written for this test: always proposes the same two tokens."""

    traits = Traits("echo", switch="enable_speculative", sizing=Sizing.CAP)
    name = traits.name

    @classmethod
    def create(cls, setup: Setup) -> "Echo":
        return cls()

    def propose(self, context, constraint, k, temperature, text=None, room=None) -> Draft:
        return Draft.legal([5, 6][:k], constraint, self.name)


def test_a_new_proposer_is_one_class_and_one_registration(monkeypatch):
    monkeypatch.setattr(registry, "REGISTERED", (*registry.REGISTERED, Echo))
    monkeypatch.setitem(registry.TRAITS, Echo.name, Echo.traits)
    speculator = Speculator(NoModel(), TOK, [EOS], config=QUIET)
    assert list(speculator.proposers.free) == ["forced", "lookup", "suffix", "guess", "echo"]
    only = SpecConfig(max_new_tokens=8, use_forced_text=False, use_prompt_lookup=False, use_structure_guesses=False,
                      use_suffix_index=False)
    batch = BatchDecoder(speculator)
    row = speculator.row([1, 3, 4], Free(), only)
    batch.add(row)
    batch.apply(batch.plan(), StepResult((logits_choosing(7),), 0.01))
    (v,) = batch.plan().verify
    assert v.feed == (7, 5, 6) and v.proposal.segments == (("echo", 2),)
    batch.apply(StepPlan((row,), (v,)), StepResult((logits_choosing(5, 6, 9),), 0.01))
    assert row.token_ids == [7, 5, 6, 9] and row.stats.per_drafter["echo"].accepted == 2


def test_the_loop_names_no_proposer():
    """The policy, the row and the batch see proposers through their traits: no proposer's name is written in spec/
    outside the proposers package, nor in engine/."""
    names = set(registry.TRAITS)
    root = Path(__file__).resolve().parents[3] / "specstruct"
    for path in [*(root / "spec").glob("*.py"), *(root / "engine").glob("*.py")]:
        for name in names:
            assert f'"{name}"' not in path.read_text(), f"{path.name} names the proposer {name!r}"


def test_the_engine_parts_satisfy_the_seams(speculator):
    from specstruct.spec.interfaces import BatchProposer, Drafter, Policy, Runtime

    assert isinstance(speculator.policy, Policy) and isinstance(speculator.target, Runtime)
    assert all(isinstance(p, Drafter) for p in speculator.proposers.free.values())
    assert not isinstance(speculator.proposers.free["forced"], BatchProposer)
