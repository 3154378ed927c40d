"""KV memory when the disk fails: a spill folder deleted or replaced by a file (a tmp cleaner, an unmounted disk).
safetensors reports such write errors as SafetensorError, not OSError. A preemption spill that cannot be written
keeps the token ids (the row is prefilled again on resume, same output); a pause that still raises ends that one
request with a clear error, never leaves it hanging nor stops the loop; the prefix cache drops a span it cannot move
to disk. Byte accounting returns to 0 in every case. Also: the active-tier headroom follows each row's own
max_candidates. Every test is bounded in time (a hang fails)."""

from __future__ import annotations

import shutil
import time
import warnings
from types import SimpleNamespace

import pytest
import torch

import specstruct as ss
from specstruct.config import EngineConfig, KVMemory, SpecConfig
from specstruct.runtime.kv import KVLostWarning, KVStore, PrefixCache, SeqKV
from specstruct.runtime.kv.memory import DEFAULT_HEADROOM, KVBudget, extra_headroom
from specstruct.runtime.kv.tiers import DiskTier, MemoryTier
from specstruct.engine.preempt import Preemption, held
from specstruct.errors import SpecStructError

LIMIT = 60
JOBS = [  # (prompt, output type, max_new_tokens): free text and a regex, long enough to outgrow the budget
    ("Go on.", None, 40),
    ("Spell it.", ss.Regex("[ab]{30}"), 40),
    ("Say something.", None, 40),
    ("Tell me more.", None, 40),
]
PER_TOKEN = 2 * 2 * 2 * 4 * 4  # k and v, 2 layers, 2 heads, dim 4, float32 (the synthetic KV below)


def _deadline() -> float:
    return time.monotonic() + LIMIT


def _kv(n: int, value: float = 1.0):
    return [(torch.full((1, 2, n, 4), value), torch.full((1, 2, n, 4), -value)) for _ in range(2)]


def _break(folder, how: str) -> None:
    """What a tmp cleaner or an unmounted disk does to a spill folder: gone, or a regular file in its place."""
    shutil.rmtree(folder)
    if how == "file":
        folder.write_text("")


class _FailingTier(MemoryTier):
    """A lower tier whose writes fail the way safetensors' do: a plain Exception, not an OSError."""

    def __init__(self, budget: int):
        super().__init__(budget, name="disk")

    def put(self, layers):
        raise RuntimeError("Error while serializing: I/O error: No such file or directory")


# -- the engine and its jobs ----------------------------------------------------------------------------------------
def _engine(tok, target, draft, tmp_path, **memory) -> ss.SpecStruct:
    """Every job's prompt fits at once (so they start together) but not their outputs: rows must take turns."""
    probe = ss.SpecStruct(target, tok, batch_config={"timeout_ms": 0})
    prompts = [len(probe.prompt_ids(p, t)) for p, t, _ in JOBS]
    probe.close()
    budget = KVBudget(None, target, draft)
    tokens = max(sum(n + budget.headroom for n in prompts) + 10,
                 max(n + m + budget.headroom for n, (_, _, m) in zip(prompts, JOBS)))
    memory = {"active_bytes": tokens * budget.per_token, "directory": str(tmp_path), **memory}
    return ss.SpecStruct(target, tok, draft_model=draft, engine_config=EngineConfig(kv_memory=KVMemory(**memory)),
                         batch_config={"timeout_ms": 300, "max_batch_size": len(JOBS)})


def _submit(e: ss.SpecStruct, job):
    prompt, output_type, max_new = job
    ids = e.prompt_ids(prompt, output_type, max_new_tokens=max_new)
    return e.scheduler.submit(ids, e.constraint(output_type).fork(), e.config.merged(max_new_tokens=max_new))


@pytest.fixture(scope="module")
def alone(tok, target, close_draft):
    """Each job's greedy output run alone, without memory pressure (the reference for every test here)."""
    e = ss.SpecStruct(target, tok, draft_model=close_draft, engine_config=EngineConfig(kv_memory=KVMemory(active_bytes=None)),
                      batch_config={"timeout_ms": 0})
    try:
        return [_submit(e, job).result(_deadline()).token_ids for job in JOBS]
    finally:
        e.close()


# -- bug: a failed spill write killed the decode loop ---------------------------------------------------------------
@pytest.mark.parametrize("how", ["deleted", "file"])
def test_preemption_whose_spill_cannot_be_written_prefills_again_with_the_same_output(
        tok, target, close_draft, tmp_path, engines, alone, how):
    e = _engine(tok, target, close_draft, tmp_path)
    engines.append(e)
    _break(e.kv_store.tiers[0].directory, how)
    reqs = [_submit(e, job) for job in JOBS]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert [r.result(_deadline()).token_ids for r in reqs] == alone
    info = e.cache_info()["preemption"]
    assert info["preemptions"] >= 1 and info["reprefilled"] == info["resumes"] == info["preemptions"]
    assert info["store"]["tokens_only"] >= 1 and info["store"]["spilled_bytes"] == 0
    assert info["paused"] == 0 and info["store"]["bytes"]["disk"] == 0
    assert e.scheduler.problem() is None  # the loop still serves
    assert any(issubclass(w.category, KVLostWarning) and "could not be spilled" in str(w.message) for w in seen)


def test_a_pause_that_raises_ends_that_request_alone_and_frees_its_spill(tok, target, close_draft, tmp_path,
                                                                         engines, alone):
    e = _engine(tok, target, close_draft, tmp_path)
    engines.append(e)
    spill, calls = e.kv_store.spill, []

    def draft_spill_fails_once(seq):
        calls.append(seq)
        if len(calls) == 2:  # the first pause: its target went to disk, then its draft cache fails
            raise RuntimeError("injected: the draft cache could not be spilled")
        return spill(seq)

    e.kv_store.spill = draft_spill_fails_once
    reqs = [_submit(e, job) for job in JOBS]
    failed = []
    for i, r in enumerate(reqs):
        try:
            assert r.result(_deadline()).token_ids == alone[i]
        except SpecStructError as err:  # a hang would fail with RequestTimeoutError instead
            assert "pausing this request" in str(err) and "injected" in str(err)
            assert alone[i][: len(r.output.token_ids)] == r.output.token_ids  # what it emitted before stays right
            failed.append(i)
    assert len(failed) == 1 and len(calls) >= 2
    info = e.cache_info()["preemption"]
    assert info["paused"] == 0 and info["store"]["bytes"]["disk"] == 0  # the target's spill was discarded
    assert not list(tmp_path.rglob("*.safetensors")) and e.scheduler.problem() is None
    assert e.run("Again.", max_new_tokens=4).token_ids  # the engine still serves


def test_store_falls_back_to_token_ids_on_any_write_error():
    store = KVStore([_FailingTier(1 << 20)])
    with pytest.warns(KVLostWarning, match="could not be spilled"):
        h = store.spill(SeqKV([1, 2, 3], _kv(3)))
    assert h.slot is None and store.info()["tokens_only"] == 1 and store.info()["bytes"]["disk"] == 0
    assert store.restore(h).layers is None


@pytest.mark.parametrize("how", ["deleted", "file"])
def test_disk_tier_put_into_a_broken_folder_raises_and_free_never_does(tmp_path, how):
    disk = DiskTier(1 << 20, tmp_path)
    slot = disk.put(_kv(2))
    _break(disk.directory, how)
    with pytest.raises(Exception):
        disk.put(_kv(2))
    assert disk.used == slot.nbytes  # the failed put counted nothing
    disk.free(slot)  # its file is gone with the folder (or unreachable): still freed, without an error
    assert disk.used == 0


# -- bug: the prefix cache freed a slot before its disk write, then freed it again ----------------------------------
@pytest.mark.parametrize("how", ["deleted", "file", "raises"])
def test_prefix_cache_drops_a_span_it_cannot_move_to_disk(tmp_path, how):
    if how == "raises":
        lower = _FailingTier(1 << 20)
    else:
        lower = DiskTier(1 << 20, tmp_path)
        _break(lower.directory, how)
    c = PrefixCache([MemoryTier(12 * PER_TOKEN), lower])
    c.insert("ns", list(range(8)), _kv(8, 1.0))
    with pytest.warns(KVLostWarning, match="could not be moved"):
        c.insert("ns", list(range(100, 108)), _kv(8, 2.0))  # over budget: the older span must leave RAM
    info = c.info()
    assert info["bytes"] == {"ram": 8 * PER_TOKEN, "disk": 0} and info["evictions"] == 1 and info["spills"] == 0
    for ids, expect in ((list(range(8)), 0), (list(range(100, 108)), 8)):  # dropped, and kept
        hit = c.lookup("ns", ids)
        hit.release()
        assert hit.tokens == expect
    c.clear()
    assert c.info()["bytes"] == {"ram": 0, "disk": 0}  # freed once: never negative


def test_requests_are_unaffected_when_the_prefix_cache_disk_fails(tok, target, close_draft, tmp_path, engines):
    prompts = ["Say something about foxes.", "Now say something about dogs.", "And cats."]

    def build(directory):
        e = ss.SpecStruct(target, tok, draft_model=close_draft,
                          engine_config=EngineConfig(prefix_cache_bytes=20_000, kv_memory=KVMemory(directory=str(directory))),
                          batch_config={"max_batch_size": 1, "timeout_ms": 0})
        engines.append(e)
        return e

    want = [build(tmp_path / "ok").run(p, max_new_tokens=8).token_ids for p in prompts]
    e = build(tmp_path / "broken")
    _break(e.prefix_cache.tiers[1].directory, "deleted")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KVLostWarning)
        assert [e.run(p, max_new_tokens=8).token_ids for p in prompts] == want
    assert e.scheduler.problem() is None and e.cache_info()["bytes"]["disk"] == 0
    e.clear_cache()
    assert e.cache_info()["bytes"] == {"ram": 0, "disk": 0}


# -- the active tier's headroom follows each row's max_candidates ---------------------------------------------------
def test_extra_headroom_follows_the_configured_cap():
    assert extra_headroom(SpecConfig()) == 0  # the default caps fit the default headroom: nothing changes
    big = SpecConfig(max_candidates={"text": 64})
    assert DEFAULT_HEADROOM + extra_headroom(big, "text") == 64 + 1  # a pass of 64 candidates + the bonus token
    assert extra_headroom(big, "json") == 0 and extra_headroom(big) == 64 + 1 - DEFAULT_HEADROOM
    assert extra_headroom(SpecConfig(max_candidates={"text": 64}, enable_speculative=False), "text") == 0


def test_a_row_with_a_large_cap_counts_its_own_headroom(target, close_draft):
    def row(config):
        return SimpleNamespace(prompt=[1] * 50, token_ids=[2] * 10, config=config,
                               constraint=SimpleNamespace(mode="text"))

    small, large = row(SpecConfig()), row(SpecConfig(max_candidates={"text": 64}))
    assert held(small) == 60 and held(large) == 60 + 65 - DEFAULT_HEADROOM
    per_token = KVBudget(None, target, close_draft).per_token
    # room for two default rows (60 tokens + 17 of headroom each), not for a second row whose pass may add 65
    budget = KVBudget(2 * (60 + DEFAULT_HEADROOM) * per_token, target, close_draft)
    preemption = Preemption(budget, KVStore([]))
    assert preemption.victims([small, row(SpecConfig())]) == []
    assert preemption.victims([small, large]) == [large]
    assert not preemption.fits([held(small)], held(large)) and preemption.fits([held(small)], held(small))


def test_a_waiting_request_with_a_large_cap_is_admitted_with_its_own_headroom(tok, target):
    """Admission counts a new request as its row will be counted once running (else: admitted, then paused)."""
    from specstruct.engine.request import Request

    engine = ss.SpecStruct(target, tok)
    try:
        req = Request([1] * 50, SimpleNamespace(mode="text"), SpecConfig(max_candidates={"text": 64}), wake=lambda: None)
        assert engine.scheduler._held(req) == 50 + 65 - DEFAULT_HEADROOM
    finally:
        engine.close()
