"""Bitmask words (constraints.base): every backend's `fill_bitmask` is its bool mask packed in llguidance's layout,
EOS exactly where final, special ids and LM-head padding never; `fill_bitmasks` fills a draft's positions in one
buffer as a walk of forks would, and leaves the constraint where it was."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from specstruct.constraints.base import ConstraintSpec, bitmask_words, fill_bitmasks, pack_mask, unpack_words
from specstruct.constraints.compiler import compile_constraint

VOCAB = 408  # tiny_model pads the LM head beyond len(tokenizer) == 400
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
CASES = {  # kind, source, json backend, an output it accepts
    "json": ("json", json.dumps(PERSON), None, json.dumps({"name": "Ada", "age": 36})),
    "json-outlines": ("json", json.dumps(PERSON), "outlines", json.dumps({"name": "Ada", "age": 36})),
    "regex": ("regex", r"[0-9]+(\.[0-9]+)?", None, "3.25"),
    "choice": ("choice", json.dumps(["yes", "yes please", "no"]), None, "yes please"),
    "grammar": ("grammar", 'start: "x" NUM\nNUM: /[0-9]+/', None, "x42"),
    "text": ("text", None, None, "hi there"),
    "code": ("code", None, None, "x = 1"),
}


def _make(tok, case: str, vocab: int = VOCAB, eos=None):
    kind, source, backend, _ = CASES[case]
    return compile_constraint(ConstraintSpec(kind, source), tok, vocab_size=vocab,
                              eos_token_ids=eos or [tok.eos_token_id], json_backend=backend)


def _words(c) -> torch.Tensor:
    out = torch.full((bitmask_words(c.vocab_size),), -1, dtype=torch.int32)  # every bit set: all must be written
    c.fill_bitmask(out)
    return out


def _ids(tok, case):
    return tok.encode(CASES[case][3], add_special_tokens=False)


def _states(c, tok, case):
    """The constraint at every prefix of the case's output, then after EOS (forks)."""
    out = [c.fork()]
    for t in _ids(tok, case):
        assert c.advance([t]) == 1
        out.append(c.fork())
    assert c.is_final() and c.advance([tok.eos_token_id]) == 1
    return out + [c.fork()]


def _legacy_llguidance_mask(c) -> torch.Tensor:
    """What GrammarConstraint.mask() computed before the words (llguidance's bytes unpacked, special ids cleared,
    EOS set exactly where final), written out again here as the reference."""
    if c._done() or c._m.is_stopped():
        bits = np.zeros(c.vocab_size, dtype=np.bool_)
    else:
        packed = np.frombuffer(c._m.compute_bitmask(), dtype=np.uint8)
        bits = np.unpackbits(packed, count=min(len(packed) * 8, c.vocab_size), bitorder="little")
        bits = np.concatenate([bits, np.zeros(c.vocab_size - len(bits), dtype=np.uint8)]).view(np.bool_)
        bits[c._special] = False
    bits[c._eos] = c.is_final()
    return torch.from_numpy(bits)


# 352: fewer ids than the tokenizer, so llguidance writes more words than the head's (copied, not written in place)
@pytest.mark.parametrize("case,vocab", [(case, VOCAB) for case in CASES] + [("json", 352), ("grammar", 352)])
def test_words_are_the_packed_bool_mask_at_every_state(tok, case, vocab):
    eos = tok.eos_token_id
    specials = [i for i, t in tok.added_tokens_decoder.items() if t.special and i != eos]
    for state in _states(_make(tok, case, vocab), tok, case):
        words = _words(state)
        mask = state.mask()
        assert torch.equal(words, pack_mask(mask)) and torch.equal(unpack_words(words, vocab), mask)
        if CASES[case][0] in ("json", "grammar") and CASES[case][2] is None:
            assert torch.equal(mask, _legacy_llguidance_mask(state))
        assert bool(mask[eos]) == state.is_final()
        assert not mask[specials].any() and not mask[len(tok):].any()
        tail = vocab % 32
        assert tail == 0 or int(words[-1]) >> tail in (0, -1) and not int(words[-1]) >> tail  # no bit past the vocab
        allowed = [t for t in mask.nonzero().flatten().tolist() if t != eos]
        assert all(state.fork().advance([t]) == 1 for t in allowed)  # (llguidance's mask may keep fewer than it
        # would accept: it writes the canonical tokens of forced text)


def test_a_special_token_the_grammar_names_is_legal_where_it_stands(tok):
    c = compile_constraint(ConstraintSpec("grammar", 'start: <[1]> "x"'), tok, vocab_size=VOCAB,
                           eos_token_ids=[tok.eos_token_id])
    words = _words(c)
    assert unpack_words(words, VOCAB).nonzero().flatten().tolist() == [1] and torch.equal(words, pack_mask(c.mask()))
    assert c.advance([1]) == 1 and not bool(unpack_words(_words(c), VOCAB)[1])


def test_every_eos_id_is_set_where_final_and_only_eos_after_it(tok):
    eos = [tok.eos_token_id, tok.pad_token_id]
    for case in ("json", "regex", "grammar", "text"):
        c = _make(tok, case, eos=eos)
        assert not unpack_words(_words(c), VOCAB)[eos].any() or c.is_final()
        c.advance(_ids(tok, case))
        assert unpack_words(_words(c), VOCAB)[eos].all()
        assert c.advance([tok.pad_token_id]) == 1
        assert unpack_words(_words(c), VOCAB).nonzero().flatten().tolist() == sorted(eos), case


@pytest.mark.parametrize("case", list(CASES))
def test_a_drafts_positions_fill_one_buffer_as_a_walk_of_forks_would(tok, case):
    c = _make(tok, case)
    ids = _ids(tok, case)
    c.advance(ids[:1])
    draft = ids[1:] + [tok.eos_token_id]  # the rest of the output, then EOS (accepted where final)
    if case not in ("text", "code"):
        draft = draft[:1] + [len(tok) - 1] + draft[1:]  # a token the constraint refuses: the state stays
    want, fork = [_mask_list(c.fork())], c.fork()
    for t in draft:
        fork.advance([t])
        want.append(_mask_list(fork))
    before = (_mask_list(c), c.is_final(), c.forced_text())
    out = torch.full((len(draft) + 1, bitmask_words(VOCAB)), -1, dtype=torch.int32)
    fill_bitmasks(c, draft, out)
    assert [unpack_words(row, VOCAB).tolist() for row in out] == want
    assert (_mask_list(c), c.is_final(), c.forced_text()) == before  # rolled back to where it was
    assert c.advance(ids[1:]) == len(ids) - 1 and c.is_final()


def _mask_list(c) -> list[bool]:
    return c.mask().tolist()


def test_an_error_mid_fill_rolls_back_and_is_the_error_raised(tok):
    c = _make(tok, "regex")

    class Failing:
        vocab_size = VOCAB

        def __init__(self):
            self.calls = 0

        def fill_bitmask(self, out):
            self.calls += 1
            if self.calls == 3:
                raise RuntimeError("the backend failed")
            c.fill_bitmask(out)

        def advance(self, tokens):
            return c.advance(tokens)

        def rollback(self, n):
            c.rollback(n)

    with pytest.raises(RuntimeError, match="the backend failed"):
        fill_bitmasks(Failing(), _ids(tok, "regex"), torch.empty(5, bitmask_words(VOCAB), dtype=torch.int32))
    assert c.advance(_ids(tok, "regex")) == len(_ids(tok, "regex"))  # back at the start


def test_a_backend_with_only_a_bool_mask_is_packed(tok):
    inner = _make(tok, "regex")

    class BoolOnly:  # a backend written against the Protocol before the words
        vocab_size = VOCAB

        def mask(self):
            return inner.mask()

        def advance(self, tokens):
            return inner.advance(tokens)

        def rollback(self, n):
            inner.rollback(n)

    out = torch.empty(3, bitmask_words(VOCAB), dtype=torch.int32)
    fill_bitmasks(BoolOnly(), _ids(tok, "regex")[:2], out)
    walk = inner.fork()
    for i, row in enumerate(out):
        assert torch.equal(row, pack_mask(walk.mask()))
        if i < 2:
            walk.advance(_ids(tok, "regex")[i:i + 1])
