"""Fixtures shared by the unit tests (see lc_tiny_engine.py for the engine)."""

from __future__ import annotations

import pytest
import torch
from lc_tiny_engine import tiny_engine


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models gain nothing from a second thread, and on a busy 2-core machine torch's spinning pool makes
    them many times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def engine():
    return tiny_engine()


@pytest.fixture
def chat(engine):
    from langchain_specstruct import ChatSpecStruct

    return ChatSpecStruct(engine=engine, max_tokens=24)
