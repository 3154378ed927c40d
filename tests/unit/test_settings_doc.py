"""docs/settings.md lists every key of EngineConfig, SpecConfig and BatchConfig, each under its own object, and no
key that is not there."""

from __future__ import annotations

import ast
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


def test_the_engine_keys_and_the_call_keys_do_not_overlap_and_each_is_refused_by_the_other():
    assert not set(EngineConfig.model_fields) & set(SpecConfig.model_fields)
    with pytest.raises(ValueError, match=r"config=SpecConfig\(temperature=\.\.\.\)"):
        EngineConfig(temperature=0.5)
    with pytest.raises(ValueError, match=r"engine_config=EngineConfig\(weights=\.\.\.\)"):
        SpecConfig(weights="q8_0")
    with pytest.raises(AttributeError, match=r"engine\.engine_config\.device"):
        SpecConfig().device  # noqa: B018  (read where one config held both)
    assert not hasattr(SpecConfig(), "nonsense") and SpecConfig().max_new_tokens == 512


@pytest.mark.parametrize("model", [EngineConfig, SpecConfig, BatchConfig])
def test_the_defaults_written_as_values_are_the_objects_defaults(model):
    """Defaults written as a literal (`"auto"`, 512, 0.7, None, True) must be the field's; prose ones (1 GiB) are
    read by people."""
    text = DOC.read_text()
    checked = 0
    for key, default in re.findall(r"^\| `(\w+)` \| ([^|]+) \|", text, flags=re.M):
        if key not in model.model_fields:
            continue
        cell = default.strip().strip("`")
        try:
            value = ast.literal_eval(cell)
        except (ValueError, SyntaxError):
            continue
        field = model.model_fields[key]
        assert (field.default_factory() if field.default_factory else field.default) == value, (key, cell)
        checked += 1
    assert checked >= 3
