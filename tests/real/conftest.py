"""Real-model tests: everything under tests/real is marked `real`, and `real` tests skip (with the command that
fixes it) when the Qwen2.5-Coder models are not pulled. Shared session fixtures load each model once."""

from __future__ import annotations

from pathlib import Path

import pytest

from specstruct import models

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    """Mark every test in this folder `real`; skip `real` tests when the models are absent."""
    available = models.models_available()
    skip = pytest.mark.skip(reason=f"real models not pulled; run: {models.pull_command()}")
    for item in items:
        if _HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.real)
        if not available and item.get_closest_marker("real"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def real_target():
    """(model, tokenizer) of the default target, qwen2.5-coder-1.5b, float32 on CPU, loaded once."""
    return models.load(models.DEFAULT_TARGET)


@pytest.fixture(scope="session")
def real_draft():
    """(model, tokenizer) of the default draft, qwen2.5-coder-0.5b, loaded once."""
    return models.load(models.DEFAULT_DRAFT)


@pytest.fixture(scope="session")
def real_engine(real_target, real_draft):
    """A SpecStruct engine over the real target and draft (shares the session's loaded models)."""
    import specstruct as ss

    (target, tokenizer), (draft, draft_tok) = real_target, real_draft
    return ss.SpecStruct(target, tokenizer, draft, draft_tokenizer=draft_tok, model_name=models.DEFAULT_TARGET)
