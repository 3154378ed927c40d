"""The llama.cpp benchmark side without a llama-server build (it is optional): what it sends, how a missing
binary is reported, and how its timings enter the per-side summary. `specstruct bench --baselines ...,llama.cpp`
runs it for real (docs/benchmarks.md)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

import specstruct as ss
from specstruct import settings
from specstruct.bench.llama_cpp import LlamaCppSide, find_binary
from specstruct.bench.measure import Settings
from specstruct.bench.summary import summarize_scenario
from specstruct.bench.workloads import Workload


class Person(BaseModel):
    name: str
    age: int


def test_a_missing_llama_server_names_the_flag_the_variable_and_the_docs(monkeypatch, tmp_path):
    monkeypatch.delenv("SPECSTRUCT_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    settings.cache_clear()
    with pytest.raises(FileNotFoundError, match=r"--llama-server PATH or set SPECSTRUCT_LLAMA_SERVER.*docs/benchmarks"):
        find_binary(None)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        find_binary(str(tmp_path / "nowhere"))


def test_the_request_carries_the_engines_exact_prompt_ids_and_the_schema(tok, target, tmp_path):
    engine = ss.SpecStruct(target, tok)
    side = LlamaCppSide(str(tmp_path / "llama-server"), tmp_path / "m.gguf", threads=2)
    side.bind(engine, Settings(max_new_tokens=7))
    messages = [{"role": "user", "content": "Ada, 36"}]
    work = Workload("w", "json", "extraction", messages, Person, None, lambda t: (None, ""))
    body = side.request(work)
    assert body["prompt"] == engine.prompt_ids(messages, Person)  # same template and schema instruction
    assert body["json_schema"] == Person.model_json_schema() and body["n_predict"] == 7
    assert body["cache_prompt"] is False and body["return_tokens"] is True and body["temperature"] == 0.0
    free = side.request(Workload("p", "prose", "prose", messages, None, None, lambda t: (None, "")))
    assert "json_schema" not in free
    code = side.request(Workload("c", "code", "code", messages, ss.Code("python"), None, lambda t: (None, "")))
    assert "json_schema" not in code and code["stop"] == ["\n```"]  # no grammar; it ends at the closing fence
    with pytest.raises(ValueError, match="no JSON schema"):
        side.request(Workload("r", "json", "regex", messages, ss.Regex("[a-z]+"), None, lambda t: (None, "")))


def test_the_summary_reports_prefill_and_decode_per_side():
    def side(elapsed, new, times):
        return {"elapsed_s": elapsed, "new_tokens": new, "tokens_per_s": new / elapsed, "times": times,
                "prompt_tokens": 10, "finish_reason": "stop"}

    record = {"id": "a", "scenario": "json", "status": "ok", "speedup": {}, "valid": {"llama.cpp": True},
              "identical": None, "sides": {
                  "specstruct": side(2.0, 20, {"prefill_s": 1.0}),
                  "target-only": side(3.0, 20, {"prefill_s": 1.0}),
                  "llama.cpp": side(1.5, 20, {"prefill_s": 0.5, "decode_tokens_per_s": 25.0})}}
    s = summarize_scenario([record])
    assert s["elapsed_s"]["llama.cpp"] == 1.5 and s["prefill_s"]["llama.cpp"] == 0.5
    assert s["decode_tokens_per_s"] == {"llama.cpp": 25.0, "specstruct": 20.0, "target-only": 10.0}
