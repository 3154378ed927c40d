"""Fixtures shared by the unit tests (see lc_tiny_engine.py for the engine)."""

from __future__ import annotations

import pytest
from lc_tiny_engine import tiny_engine


@pytest.fixture
def engine():
    return tiny_engine()


@pytest.fixture
def chat(engine):
    from langchain_specstruct import ChatSpecStruct

    return ChatSpecStruct(engine=engine, max_tokens=24)
