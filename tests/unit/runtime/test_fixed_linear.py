"""The fixed-order Linear kernel (runtime/fixed_linear.py, csrc/fixed_linear.cpp): a row's result is bitwise the
same alone or among any other rows, at any place; as accurate as stock F.linear; and where it cannot be built the
runtime says so and uses oneDNN."""

import pytest
import torch

from specstruct import settings
from specstruct.runtime import fixed_linear, native
from specstruct.runtime.fixed_linear import PanelWeight, fixed_linear_forward
from specstruct.testing import tiny_model
from specstruct.testing import OneSequence


@pytest.fixture(autouse=True)
def _built(monkeypatch):
    monkeypatch.setenv("SPECSTRUCT_LINEAR", "fixed")
    settings.cache_clear()
    if fixed_linear.kernel() is None:
        pytest.skip(fixed_linear.why_not())


# (in, out): tails of the 16-wide vectors and the 64-column panels, one and several 256-input block sums
SHAPES = [(40, 72), (33, 100), (1, 5), (300, 64), (515, 129)]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
def test_a_row_is_the_same_bits_alone_or_among_any_rows(shape, bias):
    torch.manual_seed(0)
    lin = torch.nn.Linear(*shape, bias=bias)
    plain = lin.weight.detach().clone()
    lin.weight = PanelWeight.pack(lin.weight)
    x = torch.randn(23, shape[0])
    with torch.no_grad():
        every = fixed_linear_forward(lin, x)
        for n in range(1, 24):
            assert torch.equal(fixed_linear_forward(lin, x[:n]), every[:n])  # among the first n
            assert torch.equal(fixed_linear_forward(lin, x[n - 1 : n]), every[n - 1 : n])  # alone
        shuffled = torch.randperm(23)
        assert torch.equal(fixed_linear_forward(lin, x[shuffled]), every[shuffled])  # at another place
        assert torch.equal(fixed_linear_forward(lin, x.reshape(23, 1, -1)), every.reshape(23, 1, -1))
        assert fixed_linear_forward(lin, x[:0]).shape == (0, shape[1])
        exact = x.double() @ plain.double().T + (lin.bias.double() if bias else 0)
        stock = torch.nn.functional.linear(x, plain, lin.bias)
    ours, theirs = (every.double() - exact).abs().max(), (stock.double() - exact).abs().max()
    assert ours <= 2 * theirs + 1e-6  # as accurate as stock's float32


def test_panel_weight_keeps_the_plain_shape_and_values():
    w = torch.randn(100, 33)
    packed = PanelWeight.pack(w)
    assert packed.shape == (100, 33) and packed.size() == (100, 33) and packed.size(0) == 100
    assert packed.data.shape == (2, 33, fixed_linear.kernel().panel_width)
    assert torch.equal(packed.to_dense(), w)
    packed.copy_(w * 2)
    assert torch.equal(packed.to_dense(), w * 2) and packed.shape == (100, 33)


def test_the_runtime_names_the_kernel_and_falls_back_to_onednn_where_it_cannot_be_built(tok, monkeypatch):
    ids = [5, 6, 7, 8]
    fixed = OneSequence(tiny_model(tok, seed=3))
    assert "fixed-order linear, 15 of 15 weights packed" in fixed.numerics and fixed.row_invariant
    expected = fixed.prefill(ids)
    monkeypatch.setattr(fixed_linear._KERNEL, "module", None)
    monkeypatch.setattr(fixed_linear._KERNEL, "error", "the fixed-order kernel could not be built (no compiler)")
    fallback = OneSequence(tiny_model(tok, seed=3))
    assert "oneDNN linear >=2 rows (the fixed-order kernel could not be built (no compiler))" in fallback.numerics
    assert fallback.row_invariant
    # a different kernel, so not the same bits, but the same model: the same logits to float32 precision
    torch.testing.assert_close(expected, fallback.prefill(ids), rtol=1e-4, atol=1e-4)


def test_an_unknown_kernel_name_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("SPECSTRUCT_LINEAR", "mkl")
    settings.cache_clear()
    with pytest.raises(ValueError, match="SPECSTRUCT_LINEAR='mkl' is not a linear kernel; use one of"):
        fixed_linear.kernel()


def test_a_failed_build_is_reported_once_and_a_stale_lock_is_cleared(tmp_path, monkeypatch, capsys):
    import os

    from torch.utils import cpp_extension

    lock = tmp_path / "lock"
    lock.write_text("")
    os.utime(lock, (1, 1))  # left by a build killed long ago: torch would wait on it forever
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "lock").write_text("")  # a build running now: left alone
    native.prepare_build(str(tmp_path), "specstruct_fixed_linear_x", "the fixed-order Linear kernel")
    native.prepare_build(str(fresh), "specstruct_fixed_linear_x", "the fixed-order Linear kernel")
    assert not lock.exists() and (fresh / "lock").exists()
    assert "building the fixed-order Linear kernel" in capsys.readouterr().err

    calls = []

    def no_compiler(**kwargs):
        calls.append(kwargs["name"])
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(fixed_linear._KERNEL, "module", None)
    monkeypatch.setattr(fixed_linear._KERNEL, "error", None)
    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    monkeypatch.setattr(cpp_extension, "_get_build_directory", lambda name, verbose: str(tmp_path))
    assert fixed_linear.kernel() is None and fixed_linear.kernel() is None and len(calls) == 1
    assert fixed_linear.why_not() == ("the fixed-order Linear kernel could not be built (RuntimeError: Ninja is "
                                      "required to load C++ extensions)")


def test_the_kernel_lets_other_python_threads_run():
    """A server's event loop keeps running while the decode thread is inside a layer (the GIL is released)."""
    import threading
    import time

    weight = PanelWeight.pack(torch.randn(4096, 4096))
    x = torch.randn(96, 4096)
    fixed_linear.kernel().linear(x, weight.data, 4096, None)  # warm
    stamps, stop = [], threading.Event()

    def spin():
        while not stop.is_set():
            stamps.append(time.perf_counter())

    t = threading.Thread(target=spin)
    t.start()
    try:
        time.sleep(0.02)
        start = time.perf_counter()
        fixed_linear.kernel().linear(x, weight.data, 4096, None)
        end = time.perf_counter()
    finally:
        stop.set()
        t.join()
    inside = [s for s in stamps if start <= s <= end]
    gaps = [b - a for a, b in zip([start, *inside], [*inside, end])]
    assert max(gaps) < 0.5 * (end - start)  # holding the GIL, the other thread would not run at all during the call


def test_using_sets_the_kernel_for_a_block_and_restores_what_was_there(monkeypatch):
    monkeypatch.delenv("SPECSTRUCT_LINEAR", raising=False)
    settings.cache_clear()
    with fixed_linear.using("onednn"):
        assert fixed_linear.requested_kernel() == "onednn" and fixed_linear.kernel() is None
    assert "SPECSTRUCT_LINEAR" not in __import__("os").environ
    monkeypatch.setenv("SPECSTRUCT_LINEAR", "fixed")
    settings.cache_clear()
    with pytest.raises(RuntimeError), fixed_linear.using("onednn"):
        raise RuntimeError("a failed engine build")
    assert fixed_linear.requested_kernel() == "fixed"
