"""The batch measurement helpers (specstruct.bench.batch) on tiny models: they run, count and compare."""

import specstruct as ss
from specstruct.bench.batch import measure_batch, measure_prefill_interference, requests_for
from specstruct.bench.workloads import extraction_workloads


def test_measure_batch_reports_identity_and_passes(tok, target, close_draft):
    engine = ss.SpecStruct(target, tok, draft_model=close_draft)
    reqs = requests_for(engine, extraction_workloads(3), max_new_tokens=12)
    runs = []
    [out] = measure_batch(engine, reqs, [3], report=runs.append)
    assert [r["run"] for r in runs] == ["one_at_a_time", "batched", "one_at_a_time_again"]
    assert out["identical_outputs"] == "3/3"
    assert out["batched"]["passes"] < runs[0]["passes"]  # rows shared passes
    assert out["batched"]["rows_per_pass"] > 1 and out["throughput_ratio"] > 0
    assert runs[0]["prefill_s_sum"] > 0 and out["batched"]["prefill_s_sum"] is None  # only one at a time is prefill


def test_prefill_interference_measures_each_arrival_mode(tok, target):
    engine = ss.SpecStruct(target, tok)
    reqs = requests_for(engine, extraction_workloads(3), max_new_tokens=20)
    out = measure_prefill_interference(engine, reqs[:2], reqs[2], prefill_chunk=16, warm_steps=1)
    assert set(out) == {"no_arrival", "chunked", "whole_prompt", "long_prompt_tokens"}
    assert out["chunked"]["steps"] >= 1
