"""docs/settings.md lists every key of EngineConfig, SpecConfig and BatchConfig, each under its own object, and no
key that is not there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from specstruct.config import BatchConfig, EngineConfig, SpecConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "settings.md"


def _tables() -> dict[str, set[str]]:
    sections = re.split(r"^## ", DOC.read_text(), flags=re.M)[1:]
    return {s.split(":")[0].strip(): set(re.findall(r"^\| `(\w+)` \|", s, flags=re.M)) for s in sections}


@pytest.mark.parametrize("model", [EngineConfig, SpecConfig, BatchConfig])
def test_each_table_lists_exactly_its_objects_keys(model):
    assert _tables()[model.__name__] == set(model.model_fields)


def test_the_engine_keys_and_the_call_keys_do_not_overlap():
    assert not set(EngineConfig.model_fields) & set(SpecConfig.model_fields)
