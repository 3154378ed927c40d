"""Real-model tests: everything here is marked `real` and skips (with the command that fixes it) when the
Qwen2.5-Coder models are not pulled. They use every core, and free the shared engines when done."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest
import torch

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    from specstruct import models

    available = models.models_available()
    skip = pytest.mark.skip(reason=f"real models not pulled; run: {models.pull_command()}")
    for item in items:
        if _HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.real)
            item.add_marker(pytest.mark.slow)
            if not available:
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def all_cores():
    before = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 2)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module", autouse=True)
def release_engines():
    yield
    from langchain_specstruct import clear_engines

    clear_engines()
    gc.collect()
