"""The draft model's arbitration of free candidates (proposers/draft_model.py): it keeps the hint's prefix it agrees with,
continues with its own tokens, and leaves its cache exactly as a fresh draft fed the same tokens would have it."""

from __future__ import annotations

import json

import pytest

from specstruct.config import SpecConfig
from specstruct.constraints.base import ConstraintSpec
from specstruct.constraints.compiler import compile_constraint
from specstruct.spec.proposers.draft_model import DraftState, Job, run_drafts
from specstruct.spec.speculator import Speculator
from specstruct.runtime.model_runtime import ModelRuntime
from specstruct.testing import OneSequence, draft_first, run_alone

TEXT = "def add(a, b):\n    return a + b\n"


def _free(tok, rt):
    return compile_constraint(ConstraintSpec("text", None), tok, vocab_size=rt.vocab_size,
                              eos_token_ids=[tok.eos_token_id])


def _draft(tok, rt, state, context, k, hint=()):
    """One row's drafting through the batched drafter (draft_model.run_drafts)."""
    job = Job(state, list(context), _free(tok, rt), k, 0.0, None, hint=list(hint))
    run_drafts(rt, [job], {tok.eos_token_id}, [])
    assert job.error is None
    return job


def _own(tok, rt, context, k):
    """The draft's own greedy proposal from a fresh cache."""
    return _draft(tok, rt, DraftState(rt), context, k).tokens


@pytest.mark.parametrize("wrong_at", [0, 2, None])
def test_hint_prefix_kept_where_the_draft_agrees(tok, close_draft, wrong_at):
    rt = OneSequence(close_draft)
    context = tok.encode(TEXT, add_special_tokens=False)[:6]
    own = _own(tok, rt, context, 6)
    hint = list(own[:4])
    if wrong_at is not None:
        hint[wrong_at] = (hint[wrong_at] + 1) % 300
    state = DraftState(rt)
    job = _draft(tok, rt, state, context, 2, hint)
    kept = 4 if wrong_at is None else wrong_at
    assert job.hint_kept == kept
    assert hint[:kept] + job.tokens == own[: kept + 2]  # the agreed hint, then the draft's own choices from there
    # the cache holds exactly what the state believes it holds: a further proposal equals a fresh draft's
    assert state.kv.length == len(state.tokens)
    proposed = list(context) + hint[:kept] + job.tokens
    assert _draft(tok, rt, state, proposed, 3).tokens == _own(tok, rt, proposed, 3)


@pytest.mark.parametrize("arbitration", [True, False])
def test_arbitration_is_lossless_and_counts_overruled(tok, target, far_draft, arbitration):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    eng = Speculator(ModelRuntime(target), tok, [tok.eos_token_id], draft=ModelRuntime(far_draft))
    c = compile_constraint(ConstraintSpec("json", json.dumps(schema)), tok, vocab_size=eng.target.vocab_size,
                           eos_token_ids=[tok.eos_token_id])
    ids = tok.encode('{"name": "Ada Lovelace", "age": 36} Copy this JSON exactly: {"name": "Ada', add_special_tokens=False)
    base = run_alone(eng.row(ids, c.fork(), SpecConfig(enable_speculative=False, max_new_tokens=30)))
    spec = run_alone(eng.row(ids, c.fork(), SpecConfig(max_new_tokens=30, draft_arbitration=arbitration)))
    assert spec.token_ids == base.token_ids
    per = spec.stats.per_drafter
    assert all(s.judged <= s.proposed and s.accepted <= s.judged for s in per.values())
    if not arbitration:
        assert all(s.overruled == 0 for s in per.values())


def test_draft_stops_after_a_token_it_doubts(tok, close_draft):
    rt = OneSequence(close_draft)
    context = tok.encode(TEXT, add_special_tokens=False)[:6]
    own = _own(tok, rt, context, 6)
    doubtful = Job(DraftState(rt), list(context), _free(tok, rt), 6, 0.0, None, confidence=0.999999)
    run_drafts(rt, [doubtful], {tok.eos_token_id}, [])
    assert doubtful.tokens == own[:1] and doubtful.stopped  # a random tiny draft is never that sure
    sure = Job(DraftState(rt), list(context), _free(tok, rt), 6, 0.0, None, confidence=1e-9)
    run_drafts(rt, [sure], {tok.eos_token_id}, [])
    assert sure.tokens == own and not sure.stopped


def test_the_speculator_times_a_draft_step_for_the_policy(tok, target, close_draft):
    eng = Speculator(ModelRuntime(target), tok, [tok.eos_token_id], draft=ModelRuntime(close_draft))
    assert eng.policy.draft_step > 0 and eng.policy.draft_cost is None  # measured decoding steps replace it later
    assert Speculator(ModelRuntime(target), tok, [tok.eos_token_id]).policy.draft_step is None


def test_rows_of_a_batch_plan_as_a_batch(tok, target, close_draft):
    """A lone row explores the free drafters first; rows sharing a pass leave the draft model to the batch policy."""
    from specstruct.spec.batch import BatchDecoder

    eng = Speculator(ModelRuntime(target), tok, [tok.eos_token_id], draft=ModelRuntime(close_draft))
    seen: list[bool] = []
    plan = eng.policy.plan
    eng.policy.plan = lambda mode, config=None, alone=True, **kw: seen.append(alone) or plan(mode, config, alone, **kw)
    ids = tok.encode(TEXT, add_special_tokens=False)[:8]
    batch = BatchDecoder(eng)
    for _ in range(2):
        batch.add(eng.row(ids, _free(tok, eng.target), SpecConfig(max_new_tokens=6)))
    while len(batch):
        batch.step()
    assert False in seen
    seen.clear()
    run_alone(eng.row(ids, _free(tok, eng.target), SpecConfig(max_new_tokens=6)))
    assert seen and all(seen)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_draft_confidence_is_lossless(tok, target, far_draft, temperature):
    eng = draft_first(Speculator(ModelRuntime(target), tok, [tok.eos_token_id], draft=ModelRuntime(far_draft)))
    ids = tok.encode(TEXT, add_special_tokens=False)[:8]
    runs = [run_alone(eng.row(ids, _free(tok, eng.target), SpecConfig(max_new_tokens=24, temperature=temperature,
                                                                      seed=3, draft_confidence=c or 0.0,
                                                                      enable_speculative=c is not None)))
            for c in (None, 0.0, 0.5)]
    if temperature == 0:
        assert runs[1].token_ids == runs[0].token_ids == runs[2].token_ids
    assert runs[1].stats.per_drafter["model"].proposed > 0  # the draft ran: what it proposed was verified
    # How many tokens a run drafts follows the policy's measured timings (a busy machine turns the draft off sooner),
    # so runs are not compared by count: test_draft_stops_after_a_token_it_doubts checks the cut itself.


def test_ablation_runs_variants_and_profiles_on_a_tiny_engine(tok, target, close_draft):
    from pydantic import BaseModel

    import specstruct as ss
    from benchmarks.ablation import PARTS, markdown, run
    from specstruct.bench.workloads import Workload

    class Person(BaseModel):
        name: str
        age: int

    eng = ss.SpecStruct(target, tok, draft_model=close_draft)
    w = Workload("p", "json", "extraction", [{"role": "user", "content": "Ada Lovelace, 36."}], Person, Person,
                 lambda text: (True, ""))
    refused = Workload("r", "json", "schema", w.messages, {"type": "string", "not": {"pattern": "^a"}}, None,
                       lambda text: (True, ""))
    variants = ["target-only", "all", "no-arbitration", "cap-16"]
    said: list[str] = []
    res = run(eng, {v: eng for v in variants}, [w, refused, w], variants, 16, echo=said.append)
    s = res["summary"]
    assert any("refused" in line for line in said)  # a schema no side can guarantee is skipped, not a crash
    assert all(s[v]["identical"] == 2 for v in variants)
    # every run a tenant of its own: no variant copies what another wrote for the same prompt (the suffix index)
    assert all(r["per_drafter"].get("suffix", {}).get("proposed", 0) == 0 for r in res["rows"])
    assert abs(sum(s["all"]["shares"][p] for p in PARTS) - 1.0) < 1e-6
    assert "| all |" in markdown(s)


def _json(tok, rt, schema):
    return compile_constraint(ConstraintSpec("json", json.dumps(schema)), tok, vocab_size=rt.vocab_size,
                              eos_token_ids=[tok.eos_token_id])


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_forced_tokens_join_the_draft_without_a_draft_pass(tok, close_draft, temperature):
    """Where the constraint allows exactly one token, the draft takes it without a pass of its own (it is fed with
    the next pass): the same tokens as drafting every position, in fewer passes, marked as forced runs."""
    rt = OneSequence(close_draft)
    schema = {"type": "object", "properties": {"name": {"type": "string", "enum": ["Ada Lovelace"]},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    c = _json(tok, rt, schema)
    context = tok.encode("Ada Lovelace was 36.", add_special_tokens=False)
    jobs, passes = {}, {}
    for forced in (False, True):
        calls = []
        inner = rt.forward
        rt.forward = lambda segs, keep: calls.append(len(segs[0][1])) or inner(segs, keep)
        try:
            gen = __import__("torch").Generator().manual_seed(0)
            job = Job(DraftState(rt), list(context), c.fork(), 12, temperature, gen, forced=forced)
            run_drafts(rt, [job], {tok.eos_token_id}, [])
        finally:
            del rt.forward
        assert job.error is None
        jobs[forced], passes[forced] = job, calls
    if temperature == 0.0:
        assert jobs[True].tokens == jobs[False].tokens  # a forced token is also the draft's only legal choice
    assert len(passes[True]) < len(passes[False])
    assert any(name == "forced" for name, _ in jobs[True].runs)
    assert [n for _, n in jobs[False].runs] == [len(jobs[False].tokens)]
    assert sum(n for _, n in jobs[True].runs) == len(jobs[True].tokens)
    if temperature > 0:  # q for the draft's own tokens, None for forced ones
        at = 0
        for name, n in jobs[True].runs:
            assert all((q is None) == (name == "forced") for q in jobs[True].qs[at : at + n])
            at += n


def test_ablation_compares_onednn_variants_with_their_own_target_only():
    from benchmarks.ablation import PARTS, summarize

    def row(variant, ids, decode_s):
        return {"prompt": "p", "variant": variant, "token_ids": ids, "new_tokens": 4, "decode_s": decode_s,
                "drafted": 0, "accepted": 0, "passes": 1, "per_drafter": {}, "parts": dict.fromkeys(PARTS, 0.1)}

    rows = [row("target-only", [1, 2], 2.0), row("all", [1, 2], 1.0),  # the other kernel breaks a near-tie elsewhere
            row("target-only-onednn", [1, 3], 2.5), row("linear-onednn", [1, 3], 1.25)]
    s = summarize(rows, ["target-only", "all", "target-only-onednn", "linear-onednn"])
    assert [s[v]["identical"] for v in s] == [1, 1, 1, 1]
    assert s["linear-onednn"]["decode_speedup"] == 1.6 and s["target-only-onednn"]["decode_speedup"] == 0.8


def _spy(runtime, fed: list[int]) -> None:
    forward = runtime.forward

    def counted(segments, keep):
        fed.append(sum(len(ids) for _, ids in segments))
        return forward(segments, keep)

    runtime.forward = counted


def test_the_draft_reads_a_prompt_only_when_it_drafts_and_in_chunks(tok, target, close_draft):
    from specstruct.spec.batch import CATCH_UP

    draft = ModelRuntime(close_draft)
    eng = draft_first(Speculator(ModelRuntime(target), tok, [tok.eos_token_id], draft=draft))
    prompt = tok.encode(TEXT * 40, add_special_tokens=False)[: 2 * CATCH_UP + 40]
    fed: list[int] = []
    _spy(draft, fed)
    plain = run_alone(eng.row(prompt, _free(tok, eng.target), SpecConfig(max_new_tokens=12, enable_speculative=False)))
    alone = dict(max_new_tokens=12, use_suffix_index=False)  # the same prompt again: the index would copy it all
    free = run_alone(eng.row(prompt, _free(tok, eng.target), SpecConfig(**alone, use_draft_model=False)))
    assert fed == [] and free.token_ids == plain.token_ids  # never asked: the draft never read the prompt
    drafted = run_alone(eng.row(prompt, _free(tok, eng.target), SpecConfig(**alone)))
    assert drafted.token_ids == plain.token_ids and drafted.stats.per_drafter["model"].proposed > 0
    assert fed[:2] == [CATCH_UP, CATCH_UP]  # its prompt in chunks, a step each, before its first draft
