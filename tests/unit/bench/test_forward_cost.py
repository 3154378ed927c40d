"""The forward-cost benchmark's measurement and profile on the tiny model (the figures come from the real pair)."""

from __future__ import annotations

from benchmarks.forward_cost import measure
from specstruct.testing import tiny_model, tiny_tokenizer
from specstruct.runtime.owned import peek


def test_measure_times_each_k_and_profiles_the_last():
    model = tiny_model(tiny_tokenizer(), seed=0)
    fixed = measure(model, "row-invariant, fixed-order", cache_len=8, repeats=1, ks=(1, 2))
    assert set(fixed) == {1, 2} and "fixed-order" in peek(model).numerics
    rows: list = []
    times = measure(model, "row-invariant, oneDNN", cache_len=8, repeats=1, ks=(1, 2, 4), profile=rows)
    assert "oneDNN" in peek(model).numerics
    assert set(times) == {1, 2, 4} and all(t > 0 for t in times.values())
    linear = [r for r in rows if r[0] == "mkldnn::_linear_pointwise"]
    assert linear and all(ms >= 0 for _, _, ms in rows)
    assert any(shapes and shapes[0] and shapes[0][0] == 4 for _, shapes, _ in linear)  # the k=4 pass's rows


def test_prefill_cost_times_stock_and_both_chunkings_and_leaves_the_model_row_invariant():
    from benchmarks.forward_cost import prefill_cost

    model = tiny_model(tiny_tokenizer(), seed=0)
    cost = prefill_cost(model, 40, repeats=1)
    assert set(cost) == {"stock one block", "row-invariant, 256-token chunks", "row-invariant, 32-token chunks"}
    assert all(t > 0 for t in cost.values())
    assert "row-invariant" in peek(model).numerics
