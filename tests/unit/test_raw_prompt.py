"""RawPrompt: text the model continues as written (what /v1/completions sends): no chat template, no system
message, no retries; the same constraints as any prompt."""

import pytest
from pydantic import BaseModel, field_validator

import specstruct as ss
from specstruct.testing import scripted_engine


def test_a_raw_prompt_is_tokenized_as_written_and_constrained():
    engine = scripted_engine('{"a": 1}', max_new_tokens=20)
    tok = engine.tokenizer
    raw = ss.RawPrompt("<|im_start|>user\nGive a JSON<|im_end|>\n")
    assert engine.prompt_ids(raw, {"type": "object"}) == tok.encode(raw.text)  # no template, no schema quoted
    assert engine.prompt_ids("hi") != tok.encode("hi")  # a str is still a user message in the chat template
    assert engine.generate(raw, {"type": "object", "properties": {"a": {"type": "integer"}}}) == {"a": 1}


def test_bad_raw_prompts_and_system_are_refused_and_validation_is_not_retried():
    engine = scripted_engine('{"n": 1}', max_new_tokens=20, max_retries=3)
    for bad in ("", None, b"x"):
        with pytest.raises(ss.InvalidPromptError, match="RawPrompt"):
            engine.run(ss.RawPrompt(bad))
    with pytest.raises(ss.InvalidPromptError, match="system= needs chat messages"):
        engine.run(ss.RawPrompt("x"), system="be brief")

    class Even(BaseModel):
        n: int

        @field_validator("n")
        @classmethod
        def even(cls, v):
            if v % 2:
                raise ValueError("n must be even")
            return v

    with pytest.raises(ss.ValidationRetryError, match="a RawPrompt is not retried") as err:
        engine.run(ss.RawPrompt("n:"), Even)
    assert len(err.value.attempts) == 1
