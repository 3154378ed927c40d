"""The kernel A/B benchmark's plumbing on the tiny model (the figures come from the real pair): both sides time
every k on the same packed weights, the kernel in use is restored, and a kernel compared with itself agrees bitwise."""

from __future__ import annotations

import pytest

from benchmarks.kernel_ab import compare
from specstruct import settings
from specstruct.runtime import fixed_linear
from specstruct.testing import tiny_model, tiny_tokenizer


def test_compare_times_both_sides_and_restores_the_kernel(monkeypatch):
    monkeypatch.setenv("SPECSTRUCT_LINEAR", "fixed")
    settings.cache_clear()
    if fixed_linear.kernel() is None:
        pytest.skip(fixed_linear.why_not())
    ours = fixed_linear.built()
    rows = compare(tiny_model(tiny_tokenizer(), seed=0), ours, [1, 7], repeats=1)
    assert [k for k, *_ in rows] == [1, 7]
    assert all(a > 0 and b > 0 and same for _, a, b, same in rows)
    assert fixed_linear.built() is ours


def test_another_panel_width_is_refused_and_the_kernel_kept(monkeypatch):
    import types

    monkeypatch.setenv("SPECSTRUCT_LINEAR", "fixed")
    settings.cache_clear()
    if fixed_linear.kernel() is None:
        pytest.skip(fixed_linear.why_not())
    ours = fixed_linear.built()
    with pytest.raises(ValueError, match="column panels"):
        with fixed_linear.running(types.SimpleNamespace(panel_width=ours.panel_width * 2)):
            pass
    assert fixed_linear.built() is ours
