"""Batch invariance on the real pair (Qwen2.5-Coder 1.5B target, 0.5B int8 draft, float32 row-invariant CPU):
requests decoded together in one BatchDecoder give exactly what each gives alone."""

from __future__ import annotations

import os

import pytest
import torch

from specstruct.bench.batch import Request, requests_for, run_requests
from specstruct.bench.workloads import extraction_workloads


@pytest.fixture(autouse=True)
def all_cores():
    before = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 2)
    yield
    torch.set_num_threads(before)


def test_batched_equals_alone_on_the_real_pair(real_engine):
    work = extraction_workloads(3)
    reqs = requests_for(real_engine, work, max_new_tokens=24)
    reqs.append(Request(real_engine.prompt_ids("Say hello to Ada.", None, max_new_tokens=6),  # a free-text row
                        real_engine.constraint(None), real_engine.config.merged(max_new_tokens=6)))
    alone = run_requests(real_engine, reqs, 1, prefill_chunk=64)
    together = run_requests(real_engine, reqs, len(reqs), prefill_chunk=64)
    assert not alone["errors"] and not together["errors"]
    assert together["token_ids"] == alone["token_ids"]
    assert together["passes"] < alone["passes"]
