"""The attention-stream probe's plumbing on small shapes (its figures come from the 1.5B target's): every cache and
pass size timed three ways, tiles and rows at a time the same bits."""

from __future__ import annotations

import pytest

from benchmarks import attention_stream
from specstruct.runtime import packed


def test_each_cache_and_pass_is_timed_in_tiles_row_at_a_time_and_as_a_plain_read(capsys):
    if packed._KERNEL.load() is None:
        pytest.skip(packed._KERNEL.error)
    res = attention_stream.stream([70, 130], [1, 5], layers=2, kv_heads=2, heads_per_kv=3, head_size=32, repeats=1)
    assert [(r["cache"], r["rows"]) for r in res] == [(70, 1), (70, 5), (130, 1), (130, 5)]
    for r in res:
        assert r["same_bits"] and min(r["tiles"], r["rows_at_a_time"], r["read"]) > 0
        assert r["mb"] == pytest.approx(2 * 2 * 2 * (r["cache"] + r["rows"]) * 32 * 4 / 1e6)
    attention_stream.main(["--caches", "40", "--rows", "2", "--layers", "1", "--heads-per-kv", "2", "--head-size",
                           "16", "--repeats", "1"])
    assert "| 40 | 2 |" in capsys.readouterr().out
