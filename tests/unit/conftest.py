"""Fixtures shared by the unit tests."""

import pytest

from specstruct import settings


@pytest.fixture()
def engines():
    """Engines a test builds (append them): closed at its end, spill files and threads included."""
    made = []
    yield made
    for e in made:
        e.close()


@pytest.fixture(params=["fixed", "onednn"])
def linear_kernel(request, monkeypatch):
    """Each row-invariant Linear kernel in turn (SPECSTRUCT_LINEAR): the fixed-order one, and oneDNN's."""
    monkeypatch.setenv("SPECSTRUCT_LINEAR", request.param)
    settings.cache_clear()
    if request.param == "fixed":
        from specstruct.runtime import fixed_linear

        if fixed_linear.kernel() is None:
            pytest.skip(fixed_linear.why_not())
    return request.param


@pytest.fixture
def attention_kernel():
    """The row-wise attention's C++ extension (csrc/row_attention.cpp), or a skip naming why it is not built."""
    from specstruct.runtime import packed

    ext = packed._KERNEL.load()
    if ext is None:
        pytest.skip(packed._KERNEL.error)
    return ext
