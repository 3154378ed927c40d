"""Shared fixtures: a real byte-level BPE tokenizer and random-weight Qwen2 models built in code (offline)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# Tiny models gain nothing from a second thread, and on a shared 2-core machine torch's spinning thread pool
# makes them 10-30x slower under load. Real-model tests set their own thread count.
torch.set_num_threads(1)
os.environ.setdefault("SPECSTRUCT_CACHE", str(ROOT / ".pytest_cache" / "specstruct"))
# The tests read only the schema subset shipped with them (tests/data/jsonschemabench/SOURCE.md), never a corpus
# outside the repository: the same files on every machine, so the samples and floors mean the same everywhere.
os.environ["SPECSTRUCT_JSONSCHEMABENCH"] = str(ROOT / "tests" / "data" / "jsonschemabench")


@pytest.fixture(autouse=True)
def _settings_read_afresh():
    """specstruct reads its SPECSTRUCT_* variables once per process (specstruct.settings): each test starts from the
    environment as it is, and leaves nothing it monkeypatched behind (set up before, so torn down after, the test's
    monkeypatch). A test that sets a variable calls `settings.cache_clear()` after."""
    from specstruct import settings

    settings.cache_clear()
    yield
    settings.cache_clear()


@pytest.fixture(scope="session")
def tok():
    from specstruct.testing import tiny_tokenizer

    return tiny_tokenizer()


@pytest.fixture(scope="session")
def target(tok):
    from specstruct.testing import tiny_model

    return tiny_model(tok, seed=0)


@pytest.fixture(scope="session")
def close_draft(target):
    """A draft that mostly agrees with the target."""
    from specstruct.testing import perturbed

    return perturbed(target, noise=0.05)


@pytest.fixture(scope="session")
def far_draft(tok):
    """A draft that disagrees often: independent random weights."""
    from specstruct.testing import tiny_model

    return tiny_model(tok, seed=1)
