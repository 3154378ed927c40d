"""The real Qwen2.5-Coder pair (1.5B target, 0.5B draft): typed extraction, losslessness of speculation, and
fewer target passes than tokens. Skipped with the fixing command when the models are not pulled."""

from __future__ import annotations

import os

import pytest
import torch
from pydantic import BaseModel

import specstruct as ss

TEXT = ("Grace Hopper was a computer scientist living in Arlington. She was 85 years old when she died, "
        "and is remembered for inventing the first compiler.")


class Person(BaseModel):
    name: str
    age: int
    occupation: str
    city: str


@pytest.fixture(autouse=True)
def all_cores():
    before = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 2)  # tests/conftest.py pins tiny-model tests to one thread
    yield
    torch.set_num_threads(before)


def test_typed_extraction_with_speculation_is_lossless_and_saves_passes(real_engine):
    prompt = f"Extract the person from this text: {TEXT}"
    base = real_engine.run(prompt, Person, config=real_engine.config.merged(enable_speculative=False))
    spec = real_engine.run(prompt, Person)
    assert isinstance(spec.value, Person)
    assert spec.value.name == "Grace Hopper" and spec.value.age == 85
    assert spec.token_ids == base.token_ids  # greedy speculation changes nothing
    assert spec.stats.target_forwards < spec.stats.new_tokens
    assert spec.stats.per_drafter["forced"].accepted > 0


def test_choice_and_regex_on_the_real_tokenizer(real_engine):
    sentiment = real_engine.generate("Sentiment of: 'I love this compiler!'", ss.Choice(["positive", "negative"]))
    assert sentiment == "positive"
    year = real_engine.generate("In which year was the first compiler written? Answer with the year.",
                                ss.Regex(r"(19|20)[0-9][0-9]"), max_new_tokens=8)
    assert 1900 <= int(year) < 2100


def test_tools_on_the_python_api_give_a_checked_call(real_engine):
    """Qwen2.5's `<tool_call>` is an added token: the call is parsed from the ids and checked by the grammar."""
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
        "required": ["city"]}}}
    reply = real_engine.generate([{"role": "user", "content": "What's the weather in Paris, in celsius?"}],
                                 tools=[weather], tool_choice="required", max_new_tokens=60)
    assert isinstance(reply, ss.ToolReply) and reply.content == ""
    (call,) = reply.tool_calls
    assert call["name"] == "get_weather" and call["arguments"]["city"] == "Paris"


def test_code_mode_parses(real_engine):
    code = real_engine.generate("Write a Python function `add(a, b)` that returns a + b. Only the code.",
                                ss.Code("python"), max_new_tokens=64)
    namespace: dict = {}
    exec(compile(code, "<generated>", "exec"), namespace)  # the model's code runs
    assert namespace["add"](2, 3) == 5


def test_mismatched_draft_vocabulary_is_refused(real_target):
    from specstruct.testing import tiny_model, tiny_tokenizer

    model, tokenizer = real_target
    tok = tiny_tokenizer()
    with pytest.raises(ss.IncompatibleDraftError):
        ss.SpecStruct(model, tokenizer, tiny_model(tok), draft_tokenizer=tok)
