"""The LM head over only the panels a mask allows (runtime/sparse_head.py): a masked row's allowed logits are
bitwise the whole head's, excluded ones -inf; rows without a mask, or with a wide one, get the whole head."""

from __future__ import annotations

import pytest
import torch

from specstruct.runtime import quantized, sparse_head
from specstruct.runtime.gguf_model import load_quantized
from specstruct.runtime.packed import forward_packed
from specstruct.testing import OneSequence, tiny_model, write_gguf


@pytest.fixture(scope="module")
def loaded(tmp_path_factory, tok):
    try:
        quantized.kernel()
    except RuntimeError as e:
        pytest.skip(str(e))
    model = tiny_model(tok)
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf(model, path, "Q8_0")
    return load_quantized(path, model.config)


def _mask(vocab: int, allowed) -> torch.Tensor:
    m = torch.zeros(vocab, dtype=torch.bool)
    m[list(allowed)] = True
    return m


def test_plan_reads_the_panels_of_narrow_masks_only():
    vocab = 400  # 25 panels of 16
    narrow, wide = _mask(vocab, [3, 40, 399]), torch.ones(vocab, dtype=torch.bool)
    rows, panels = sparse_head.plan([narrow, None, wide, _mask(vocab, [41])], vocab)
    assert rows == [0, 3] and panels.tolist() == [0, 2, 24]
    assert sparse_head.plan([None, wide], vocab) is None  # nothing narrow
    assert sparse_head.plan([_mask(vocab, range(0, vocab, 16))], vocab) is None  # few tokens, but in every panel
    assert sparse_head.plan([_mask(vocab + 1, [3])], vocab) is None  # not this head's mask: the whole head
    odd = sparse_head.plan([_mask(401, [400])], 401)  # a last partial panel
    assert odd is not None and odd[1].tolist() == [25]


def test_masked_rows_get_the_whole_heads_bits_where_allowed(loaded, tok):
    rt = OneSequence(loaded)
    vocab = rt.runtime.vocab_size
    ids = tok.encode('{"name": "Ada", "age": 36}', add_special_tokens=False)
    a, b = rt.sequence(), rt.sequence()
    want = forward_packed(loaded, [(a, ids[:5]), (a.__class__(loaded.config), ids[:3])], [3, 1])
    masks = [[_mask(vocab, [1, 2, 300]), None, torch.ones(vocab, dtype=torch.bool)], None]
    got = forward_packed(loaded, [(b, ids[:5]), (b.__class__(loaded.config), ids[:3])], [3, 1], masks)
    with pytest.raises(ValueError, match="kept positions"):
        forward_packed(loaded, [(b.__class__(loaded.config), ids[:3])], [3], [masks[0][:2]])
    read = torch.cat([torch.arange(0, 16), torch.arange(288, 304)])  # the panels of tokens 1, 2 and 300
    assert torch.equal(got[0][0][read], want[0][0][read])
    others = torch.ones(vocab, dtype=torch.bool)
    others[read] = False
    assert bool((got[0][0][others] == float("-inf")).all())
    assert torch.equal(got[0][1:], want[0][1:]) and torch.equal(got[1], want[1])  # no mask, a wide one, a prefill
    assert "forward" not in loaded.get_output_embeddings().__dict__  # the head's own forward again after the pass


@pytest.mark.parametrize("kind", ["json", "regex", "choice"])
def test_decoding_is_token_for_token_the_whole_heads(loaded, tok, monkeypatch, kind):
    import json

    from specstruct.config import SpecConfig
    from specstruct.constraints.base import ConstraintSpec
    from specstruct.constraints.compiler import compile_constraint
    from specstruct.runtime.model_runtime import ModelRuntime
    from specstruct.spec.speculator import Speculator
    from specstruct.testing import run_alone

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    spec = {"json": ConstraintSpec("json", json.dumps(schema)),
            "regex": ConstraintSpec("regex", r"(19|20)\d\d-(0[1-9]|1[0-2])-[0-2]\d"),
            "choice": ConstraintSpec("choice", json.dumps(["positive", "negative", "neutral"]))}[kind]
    eng = Speculator(ModelRuntime(loaded), tok, [tok.eos_token_id])
    constraint = compile_constraint(spec, tok, vocab_size=eng.target.vocab_size, eos_token_ids=[tok.eos_token_id])
    prompt = tok.encode("Grace Hopper, 85, 1906-12-09, positive. Answer:", add_special_tokens=False)
    monkeypatch.setattr(sparse_head, "MAX_SHARE", 1.0)
    used = []
    plan = sparse_head.plan
    monkeypatch.setattr(sparse_head, "plan", lambda *a, **k: used.append(plan(*a, **k)) or used[-1])

    def decode(**cfg):
        return run_alone(eng.row(prompt, constraint.fork(), SpecConfig(max_new_tokens=32, **cfg))).token_ids

    sparse = [decode(enable_speculative=s) for s in (False, True)]
    assert any(p is not None for p in used)  # some passes read only some panels
    monkeypatch.setattr(sparse_head, "plan", lambda *a, **k: None)
    whole = [decode(enable_speculative=s) for s in (False, True)]
    assert sparse == whole and whole[0] == whole[1]
