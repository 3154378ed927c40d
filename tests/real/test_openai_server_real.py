"""The OpenAI-compatible server on the real Qwen2.5-Coder pair, through the official `openai` client: a typed
extraction (json_schema via the parse helper) and a forced tool call (Qwen's `<tool_call>` added tokens)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serving"))
from pydantic import BaseModel  # noqa: E402
from server_fixtures import running  # noqa: E402

from specstruct.serving.openai import create_app  # noqa: E402


class Person(BaseModel):
    name: str
    age: int


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def client(real_engine):
    with running(create_app(real_engine, served_model_name="qwen")) as base:
        yield openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=600)


def test_real_structured_output_and_tool_call(client):
    r = client.chat.completions.parse(model="qwen", max_tokens=40, response_format=Person, messages=[
        {"role": "user", "content": "Extract the person: Ada Lovelace died at 36."}])
    person = r.choices[0].message.parsed
    assert isinstance(person, Person) and "Ada" in person.name and person.age == 36
    assert r.model_extra["specstruct"]["tokens_per_forward"] > 1
    r = client.chat.completions.create(model="qwen", max_tokens=60, tools=[WEATHER], tool_choice="required",
                                       messages=[{"role": "user", "content": "What's the weather in Paris?"}])
    (call,) = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert "Paris" in json.loads(call.function.arguments)["city"]
