"""The attention-stream probe's plumbing on small shapes and the tiny model (its figures come from the 1.5B target's):
every cache and pass size timed in tiles, row at a time, as a plain read and by another build, all the same bits;
a model's passes with two builds swapped in, the same logits."""

from __future__ import annotations

import pytest

from benchmarks import attention_stream
from specstruct.runtime import packed
from specstruct.testing import tiny_model, tiny_tokenizer


def test_each_cache_and_pass_is_timed_in_tiles_row_at_a_time_as_a_read_and_by_another_build(attention_kernel, capsys):
    res = attention_stream.stream([70, 130], [1, 5], layers=2, kv_heads=2, heads_per_kv=3, head_size=32, repeats=1,
                                  other=attention_kernel)  # this tree's build stands for another version's
    assert [(r["cache"], r["rows"]) for r in res] == [(70, 1), (70, 5), (130, 1), (130, 5)]
    for r in res:
        assert r["same_bits"] and min(r["tiles"], r["rows_at_a_time"], r["read"], r["other"]) > 0
        assert r["mb"] == pytest.approx(2 * 2 * 2 * (r["cache"] + r["rows"]) * 32 * 4 / 1e6)
    attention_stream.main(["--caches", "40", "--rows", "2", "--layers", "1", "--heads-per-kv", "2", "--head-size",
                           "16", "--repeats", "1"])
    assert "| 40 | 2 |" in capsys.readouterr().out


def test_a_models_passes_are_timed_with_each_build_swapped_in(attention_kernel):
    res = attention_stream.passes(tiny_model(tiny_tokenizer(), seed=0), [40], [1, 3], repeats=1, other=attention_kernel)
    assert [(r["cache"], r["rows"]) for r in res] == [(40, 1), (40, 3)]
    assert all(r["same_bits"] and r["this"] > 0 and r["other"] > 0 for r in res)
    assert packed._KERNEL.module is attention_kernel  # swapped back


def test_a_model_needs_the_other_version():
    with pytest.raises(SystemExit):
        attention_stream.main(["--model", "qwen2.5-coder-1.5b"])
