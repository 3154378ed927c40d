"""What crosses from the engine's thread to a caller is a copy: a finished request's Output is frozen and shares
nothing with the row the engine keeps decoding with."""

from __future__ import annotations

import dataclasses

import pytest

from specstruct.engine.request import Output
from specstruct.testing import scripted_engine


def test_a_finished_request_hands_over_a_frozen_copy_not_the_row():
    engine = scripted_engine('{"a": 1}')
    req = engine.scheduler.submit(engine.prompt_ids("go"), engine.constraint({"type": "object"}).fork(),
                                  engine.config)
    out = req.result()
    assert isinstance(out, Output) and out.finish_reason == "stop" and out.complete
    assert engine.tokenizer.decode(out.token_ids, skip_special_tokens=True) == '{"a": 1}'
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.token_ids = []  # type: ignore[misc]
    assert not hasattr(req, "row")  # the row stays on the engine's thread


def test_an_output_cut_by_max_new_tokens_says_it_is_not_a_whole_value():
    engine = scripted_engine('{"a": 12345}', max_new_tokens=3)
    req = engine.scheduler.submit(engine.prompt_ids("go"), engine.constraint({"type": "object"}).fork(),
                                  engine.config)
    out = req.result()
    assert out.finish_reason == "length" and not out.complete
