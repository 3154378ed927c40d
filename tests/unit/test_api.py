"""The public API over tiny models: typed results, retries, errors, streaming, per-call settings."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, field_validator

import specstruct as ss
from specstruct.testing import tiny_model, tiny_tokenizer


class Flag(BaseModel):
    ok: bool


@pytest.fixture(scope="module")
def engine(tok, target, close_draft):
    return ss.SpecStruct(target, tok, draft_model=close_draft)


def test_typed_result_and_stats(engine):
    res = engine.run("Is the sky blue?", Flag)
    assert isinstance(res.value, Flag)
    assert res.text.startswith('{"ok": ')
    s = res.stats
    assert s.mode == "json" and s.new_tokens == len(res.token_ids) > 0
    assert 0 < s.target_forwards <= s.new_tokens + 1
    assert s.tokens_per_forward == s.new_tokens / s.target_forwards
    assert s.elapsed_s > 0 and s.tokens_per_s > 0 and 0 < s.mask_time_s < s.elapsed_s
    assert set(s.to_dict()) >= {"acceptance_rate", "tokens_per_forward", "per_drafter", "k_histogram",
                                "candidates_per_step"}
    assert s.steps == sum(s.k_histogram.values()) == s.target_forwards - 1  # every pass after the prefill's
    assert s.candidates_per_step == s.drafted / s.steps


def test_generate_returns_the_value(engine):
    assert isinstance(engine.generate("Is the sky blue?", Flag), Flag)
    assert isinstance(engine.generate("Say something.", max_new_tokens=5), str)


def test_validation_retry_feeds_the_error_back_then_succeeds(engine):
    calls = []

    class Picky(BaseModel):
        ok: bool

        @field_validator("ok")
        @classmethod
        def first_time_wrong(cls, v):
            calls.append(v)
            if len(calls) == 1:
                raise ValueError("try again")
            return v

    res = engine.run("Is the sky blue?", Picky)
    assert len(res.attempts) == 1 and "try again" in res.attempts[0]["error"]
    assert isinstance(res.value, Picky)


def test_validation_retry_error_carries_every_attempt(engine):
    class Never(BaseModel):
        ok: bool

        @field_validator("ok")
        @classmethod
        def never(cls, v):
            raise ValueError("never valid")

    with pytest.raises(ss.ValidationRetryError) as info:
        engine.run("Is the sky blue?", Never, config=ss.SpecConfig(max_retries=2))
    assert len(info.value.attempts) == 3
    assert all("never valid" in a["error"] for a in info.value.attempts)


def test_incomplete_structured_output_raises_with_partial_text(engine):
    class Long(BaseModel):
        name: str
        text: str

    with pytest.raises(ss.IncompleteOutputError) as info:
        engine.run("Write.", Long, max_new_tokens=3)
    assert info.value.text and len(info.value.token_ids) == 3


def test_prompt_too_long_names_the_fix(engine):
    with pytest.raises(ss.PromptTooLongError, match="max_new_tokens"):
        engine.run("word " * 5000, max_new_tokens=10)


def test_unknown_config_key_is_an_error():
    with pytest.raises(ValueError, match="enable_speculativ"):
        ss.SpecConfig(enable_speculativ=False)


def test_candidate_caps_merge_into_the_defaults_and_are_checked():
    caps = ss.SpecConfig(max_candidates={"json": 16}).max_candidates
    assert caps["json"] == 16 and caps["text"] == 2 and caps["code"] == 8  # text used to fall back to json's 16
    assert ss.SpecConfig().merged(max_candidates={"text": 6}).cap("json") == 8
    with pytest.raises(ValueError, match="unknown output modes.*yaml"):
        ss.SpecConfig(max_candidates={"yaml": 3})
    for bad in (-1, 65, 2.5):
        with pytest.raises(ss.InvalidParameterError, match="0 to 64"):
            ss.SpecConfig().merged(max_candidates={"json": bad})


def test_draft_with_another_vocabulary_is_refused(tok, target):
    other = tiny_tokenizer(vocab_size=300)
    with pytest.raises(ss.IncompatibleDraftError, match="tokens"):
        ss.SpecStruct(target, tok, draft_model=tiny_model(other), draft_tokenizer=other)


def test_stream_text_adds_up_and_last_chunk_has_result(engine):
    chunks = list(engine.stream("Is the sky blue?", Flag))
    final = chunks[-1].result
    assert final is not None and all(c.result is None for c in chunks[:-1])
    assert "".join(c.text for c in chunks) == final.text
    assert isinstance(final.value, Flag)
    assert any(isinstance(c.partial, dict) for c in chunks[:-1])


def test_per_call_settings_and_chat_messages(engine):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    a = engine.run(messages, max_new_tokens=6, config=ss.SpecConfig(enable_speculative=False))
    b = engine.run(messages, max_new_tokens=6)
    assert a.token_ids == b.token_ids and a.stats.drafted == 0
    sampled = {engine.generate("Hello", max_new_tokens=6, temperature=1.0, seed=s) for s in range(4)}
    assert len(sampled) > 1
    assert engine.generate("Hello", max_new_tokens=6, temperature=1.0, seed=3) == \
        engine.generate("Hello", max_new_tokens=6, temperature=1.0, seed=3)


def test_stop_strings_cut_text(engine):
    full = engine.generate("Hello", max_new_tokens=12)
    stop = full[3:5]
    cut = engine.generate("Hello", max_new_tokens=12, stop=[stop])
    assert cut == full[: full.index(stop)]


def test_constraint_accepts(engine):
    c = engine.constraint(Flag)
    assert c.accepts('{"ok": true}') and not c.accepts('{"ok": 1}') and not c.accepts('{"ok": tr')
