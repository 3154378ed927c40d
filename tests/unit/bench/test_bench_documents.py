"""The document scenario on tiny models: the documents ship with the package, every field of each record is stated
in its document, and the runner measures a document workload on every side it names (speed is not asserted)."""

from __future__ import annotations

import json
import re
import tomllib
from importlib import resources
from pathlib import Path

import pytest

from specstruct.bench import run_benchmark
from specstruct.bench.documents import DOCUMENTS, document_text, documents
from specstruct.bench.llama_cpp import LlamaCppSide
from specstruct.bench.measure import Settings
from specstruct.bench.workloads import DOCUMENT, load_workloads
from specstruct.testing import scripted_engine

EXPECTED = json.loads(resources.files("specstruct.bench").joinpath("data", "documents", "expected.json").read_text())


def _leaves(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def test_the_documents_ship_as_package_data_and_are_one_to_two_pages():
    package_data = tomllib.loads(Path("pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "bench/data/documents/*.md" in package_data["specstruct"]
    assert "bench/data/documents/*.json" in package_data["specstruct"]
    docs = documents()
    assert [name for name, _, _ in docs] == [name for name, _ in DOCUMENTS] and len(docs) >= 6
    for name, _, text in docs:
        words = len(text.split())
        assert 800 <= words <= 2200, (name, words)  # 1,000-3,000 tokens with the instruction and schema
        assert "lorem" not in text.lower()


@pytest.mark.parametrize("name, model", DOCUMENTS)
def test_every_field_of_the_record_is_stated_in_its_document(name, model):
    record = model.model_validate(EXPECTED[name])  # the hand-checked answer is an instance of the output type
    assert set(EXPECTED[name]) == set(model.model_fields)
    text = document_text(name)
    digits = text.replace(",", "")
    for value in _leaves(record.model_dump()):
        if isinstance(value, str):
            assert value.lower() in text.lower(), (name, value)
        else:
            number = f"{value:g}" if isinstance(value, float) else str(value)
            assert re.search(rf"(?<![\d.]){re.escape(number)}(?!\d)", digits), (name, value)


def test_the_workloads_ask_for_the_record_and_judge_its_json():
    works = load_workloads(DOCUMENT, 2)
    assert [w.id for w in works] == ["document:commercial_lease", "document:discharge_summary"]
    w = works[0]
    assert w.scenario == DOCUMENT and w.constrained and w.output_type.__name__ == "Lease"
    assert document_text("commercial_lease").strip() in w.messages[0]["content"]
    assert w.validate(json.dumps(EXPECTED["commercial_lease"])) == (True, "")
    ok, why = w.validate(json.dumps({**EXPECTED["commercial_lease"], "term_months": "five years"}))
    assert ok is False and "term_months" in why


def test_the_runner_measures_a_document_on_each_side():
    """A scripted target writes the expected record: the loop, the constraint and the validators run for real over
    a two-page prompt; both specstruct sides give the same tokens."""
    work = load_workloads(DOCUMENT, 5)[4]  # the job offer
    engine = scripted_engine(json.dumps(EXPECTED["job_offer"]))
    res = run_benchmark(engine, scenarios=[DOCUMENT], baselines=["specstruct"], workloads={DOCUMENT: [work]},
                        settings=Settings(max_new_tokens=400))
    (record,) = res["records"]
    assert record["status"] == "ok" and record["identical"] is True
    assert record["valid"] == {"target-only": True, "specstruct": True}
    assert record["sides"]["specstruct"]["prompt_tokens"] > 1000
    assert res["scenarios"][DOCUMENT]["prompts"] == 1


def test_llama_cpp_gets_the_same_prompt_ids_and_the_records_schema(tmp_path):
    engine = scripted_engine("{}")
    side = LlamaCppSide(str(tmp_path / "llama-server"), tmp_path / "m.gguf", threads=2)
    side.bind(engine, Settings(max_new_tokens=512))
    work = load_workloads(DOCUMENT, 1)[0]
    body = side.request(work)
    assert body["prompt"] == engine.prompt_ids(work.messages, work.output_type)
    assert body["json_schema"] == work.output_type.model_json_schema() and body["n_predict"] == 512
