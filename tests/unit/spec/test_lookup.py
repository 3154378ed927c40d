"""Prompt lookup on text (proposers/lookup.py) and its length in the policy, with the tests' real BPE tokenizer."""

from __future__ import annotations

import json

import pytest

from specstruct.config import SpecConfig
from specstruct.constraints.base import ConstraintSpec
from specstruct.constraints.compiler import compile_constraint
from specstruct.spec.policy import PROBE_EVERY, AdaptivePolicy
from specstruct.spec.proposers.lookup import PromptLookupDrafter, longest_earlier

PROMPT = "Extract the person: Northwind Traders hired Erik Lindqvist, 31, a marine biologist from Gothenburg.\n"
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "city": {"type": "string"}},
          "required": ["name", "city"]}


@pytest.mark.parametrize("text, expected", [
    ("abcXabc", (3, 3)),  # the whole repeat
    ("abcabcabc", (6, 6)),  # overlapping occurrences: the longest suffix that ends before the end
    ("xyz", (0, 0)),
    ("a", (0, 0)),
    ("", (0, 0)),
    ("ab1 cab1 zab", (2, 7)),  # "zab" never occurred: "ab", most recent occurrence
])
def test_longest_earlier(text, expected):
    length, end = longest_earlier(text)
    assert (length, end) == expected
    if length:
        assert text[end - length : end] == text[-length:] and end < len(text)


def test_longest_earlier_is_the_brute_force_answer():
    import random

    rng = random.Random(0)
    for _ in range(300):
        text = "".join(rng.choice("ab c") for _ in range(rng.randrange(1, 40)))
        brute = max((n for n in range(1, len(text)) if text.rfind(text[-n:], 0, len(text) - 1) >= 0), default=0)
        length, end = longest_earlier(text)
        assert length == brute
        if length:
            assert end == text.rfind(text[-length:], 0, len(text) - 1) + length


def _json(tok):
    return compile_constraint(ConstraintSpec("json", json.dumps(SCHEMA)), tok, vocab_size=len(tok),
                              eos_token_ids=[tok.eos_token_id])


def _propose(tok, written: str, k: int = 8, prompt: str = PROMPT, room: int | None = None) -> str:
    """What the lookup proposes after the prompt and `written` (a JSON prefix the constraint has accepted)."""
    constraint = _json(tok)
    ids = tok.encode(written, add_special_tokens=False)
    assert constraint.advance(ids) == len(ids)
    draft = PromptLookupDrafter(tok).propose(tok.encode(prompt, add_special_tokens=False) + ids, constraint, k, 0.0,
                                             room=room)
    assert draft.source == "lookup" and len(draft.tokens) <= max(k, room or k)
    return tok.decode(draft.tokens)


def test_copies_across_a_different_tokenization(tok):
    # the prompt holds " Lindqvist" after a space; inside the JSON string the name starts after a quote, so the
    # output's tokens differ from the prompt's: the text still matches and the rest of the name is proposed
    got = _propose(tok, '{"name": "Erik L')
    assert got.startswith("indqvist")


def test_no_guess_at_the_start_of_a_json_value(tok):
    # `"city": "` ends in structure: what followed an earlier `": "` is not this value
    assert _propose(tok, '{"name": "Erik Lindqvist", "city": "') == ""


def test_a_value_start_copies_from_a_word_start(tok):
    # ` "c` last occurred in the key `, "city"`, and `c` last inside a word ("record"): the value is the address
    prompt = "Write to c.okafor@luth.example.ng about the record.\n"
    assert _propose(tok, '{"name": "Chinwe", "city": "c', prompt=prompt).startswith(".okafor@")


def test_a_copy_finishes_its_word_where_the_step_has_room(tok):
    prompt = "Write to grace.hopper@navy.example.mil about the COBOL standard.\n"
    written = '{"name": "Grace", "city": "gr'
    assert len(tok.encode(_propose(tok, written, k=2, prompt=prompt), add_special_tokens=False)) == 2
    assert _propose(tok, written, k=2, prompt=prompt, room=32) == "ace.hopper@navy.example.mil"
    prompt = "Grace Hopper wrote it on a ship in the harbour at night\n"
    k2 = _propose(tok, '{"name": "Gr', k=2, prompt=prompt, room=8)  # a short word, no clause's end in reach: k rules
    assert k2.startswith("ace") and len(tok.encode(k2, add_special_tokens=False)) == 2


@pytest.mark.parametrize("written, copy", [
    ('{"name": "Erik L', "indqvist"),  # the source goes on with ", 31,": the copy stops at the clause's end
    ('{"name": "Erik Lindqvist", "city": "Gothe', "nburg"),  # a sentence's full stop
    ('{"name": "Erik", "city": "Tam', "pere"),  # a line break: a JSON string holds none
])
def test_a_string_copy_stops_where_its_clause_ends(tok, written, copy):
    assert _propose(tok, written, k=3, room=8, prompt=PROMPT + "Ship to Tampere\nby Friday") == copy
    assert _propose(tok, '{"name": "Northwind T', k=3, room=8).startswith("raders")  # no clause's end in reach


def test_proposals_stay_within_k_and_the_grammar(tok):
    got = _propose(tok, '{"name": "North', k=3)
    assert 0 < len(tok.encode(got, add_special_tokens=False)) <= 3 and got.startswith("wind")
    # the copy runs on past the value's end ("Northwind Traders hired ..."): the grammar keeps only what is legal
    constraint = _json(tok)
    written = tok.encode('{"name": "Erik", "city": "Gothenburg', add_special_tokens=False)
    assert constraint.advance(written) == len(written)
    draft = PromptLookupDrafter(tok).propose(tok.encode(PROMPT, add_special_tokens=False) + written, constraint, 8,
                                             0.0)
    check = _json(tok)
    assert check.advance(written + draft.tokens) == len(written) + len(draft.tokens)  # every proposed token legal


def test_lookup_length_follows_its_two_rates():
    pol = AdaptivePolicy(SpecConfig(), {"forced", "lookup"})
    assert pol.plan("json").limits["lookup"] >= 4  # the prior rates and row cost: a long copy
    for rows in range(1, 10):
        pol.observe_cost("target", rows, 1.0 + 0.03 * (rows - 1))  # rows nearly free, as measured on a CPU
    for _ in range(20):
        pol.observe("json", "lookup", 1, 0)  # every first token wrong
    first, copy = pol.lookup_rates("json", "lookup")
    assert first < 0.01 and copy == 0.8  # no copy was judged
    limits = [pol.plan("json").limits.get("lookup", 0) for _ in range(2 * PROBE_EVERY)]
    assert limits.count(0) >= 2 * PROBE_EVERY - 2 and 1 in limits  # off, probed now and then
    for _ in range(20):
        pol.observe("json", "lookup", 6, 5)  # copies right up to the value's end
    assert pol.lookup_rates("json", "lookup")[0] > 0.99 and pol.plan("json").limits["lookup"] >= 6
    assert pol.lookup_rates("code", "lookup") == pol.lookup_rates("text", "lookup")  # per mode


def test_lookup_candidates_are_valued_as_a_guess_then_a_copy():
    from specstruct.spec.row import Step

    pol = AdaptivePolicy(SpecConfig(), {"forced", "lookup"})
    pol.lookup[("json", "lookup")] = (0.3, 0.9)
    step = Step(None, 8, 0)
    step.add("forced", [1, 2], None)
    step.add("lookup", [3, 4, 5], None)
    assert pol.candidate_rates("json", step.segments, 0.7) == [0.7, 0.7, 0.3, 0.9, 0.9]


def test_outside_json_a_match_needs_a_few_characters(tok):
    from specstruct.spec.proposers.lookup import MIN_MATCH

    free = compile_constraint(ConstraintSpec("text", None), tok, vocab_size=len(tok),
                              eos_token_ids=[tok.eos_token_id])
    drafter = PromptLookupDrafter(tok)

    def propose(written: str) -> str:
        ids = tok.encode(PROMPT + written, add_special_tokens=False)
        return tok.decode(drafter.propose(ids, free.fork(), 4, 0.0).tokens)

    assert propose("So Go") == ""  # "Go" (and " Go") occurred, but fewer than MIN_MATCH characters match
    assert MIN_MATCH <= len(" Gothe") and propose("So Gothe").startswith("nbur")


def test_a_row_hands_drafters_its_context_as_text(tok, target):
    from specstruct.runtime.model_runtime import ModelRuntime
    from specstruct.spec.speculator import Speculator

    spec = Speculator(ModelRuntime(target), tok, [tok.eos_token_id])
    prompt = tok.encode(PROMPT, add_special_tokens=False)
    row = spec.row(prompt, _json(tok), SpecConfig())
    written = tok.encode('{"name": "Grüße, Erik', add_special_tokens=False)
    for n in range(len(written) + 1):  # committed tokens arrive a few at a time; candidates on top
        row.token_ids = written[:n]
        cands = written[n : n + 2]
        assert row._context_text(cands) == tok.decode(prompt + written[: n + 2])
