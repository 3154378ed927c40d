"""Generation on a sample of the real JSONSchemaBench corpus with a tiny random model, sampling at temperature 1:
every output that completes validates against its schema (jsonschema), and none is ever invalid. An output that
runs out of tokens raises IncompleteOutputError instead of returning partial JSON."""

from __future__ import annotations

import json

import jsonschema
import pytest

import specstruct as ss
from specstruct.bench.conformance import corpus_files
from specstruct.testing import tiny_model

SAMPLE = 60


@pytest.fixture(scope="module")
def engine(tok):
    # a flat LM head so sampling wanders through the automaton instead of repeating one token forever
    return ss.SpecStruct(tiny_model(tok, seed=5, peaky=0.5), tok)


@pytest.mark.slow
def test_generated_values_validate_on_a_corpus_sample(engine):
    files = corpus_files(limit=SAMPLE * 3, seed=7)
    compiled = complete = incomplete = 0
    for path in files:
        if compiled >= SAMPLE:
            break
        schema = json.loads(path.read_text())["schema"]
        try:
            engine.constraint(schema)
        except ss.ConstraintError:
            continue
        compiled += 1
        try:
            result = engine.run("Generate a JSON instance.", schema, temperature=1.0, seed=compiled,
                                max_new_tokens=256, config=ss.SpecConfig(max_retries=0))
        except ss.IncompleteOutputError as err:
            incomplete += 1
            assert err.text  # the partial text travels with the error
            continue
        jsonschema.validate(json.loads(result.text), schema)  # raises on any invalid value
        assert result.value == json.loads(result.text)
        complete += 1
    print(f"compiled={compiled} complete={complete} incomplete={incomplete}")
    assert compiled >= SAMPLE // 2, f"only {compiled} schemas compiled"
    assert complete >= compiled // 2, f"{complete} of {compiled} completed ({incomplete} ran out of tokens)"
