"""Linear weights prepacked, for oneDNN (runtime/linear.py) or for the fixed-order kernel (fixed_linear.py):
the plain weights' values, bitwise; row-invariant; undone by restore_stock; and the usual things users do with a
model still work. Tests taking `linear_kernel` run once per kernel."""

import copy
import io

import pytest
import torch

from specstruct import settings
from specstruct.bench.fairness import weights_fingerprint
from specstruct.runtime import linear
from specstruct.runtime.linear import PackedWeight, PackedWeightError, onednn_linear_forward, unpack_linears
from specstruct.runtime.model_runtime import make_row_invariant, quantize_draft, restore_stock
from specstruct.testing import perturbed, tiny_model
from specstruct.testing import OneSequence
from specstruct.runtime.owned import hand_over, peek

TEXT = '{"name": "Ada Lovelace", "age": 36, "tags": ["math", "code"]}'


def _weights(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _switched(model):
    """A runtime over `model` itself, switched in place as the runtime's own modules are (these tests check what a
    packed module does); a user's module would be copied first (test_owned.py)."""
    hand_over(model)
    return OneSequence(model)


def _decode(model, ids):
    """Prefill a prompt, then one token at a time: logits after every position."""
    rt = _switched(model)
    return torch.stack([rt.prefill(ids[:3])] + [rt.extend([t])[0] for t in ids[3:]])


def _packed(model):
    return [m for m in model.modules() if isinstance(getattr(m, "weight", None), PackedWeight)]


@pytest.mark.parametrize("bias", [True, False])
def test_packed_weight_gives_the_plain_results_bitwise_for_any_row_count(bias):
    torch.manual_seed(0)
    lin = torch.nn.Linear(72, 40, bias=bias)
    x = torch.randn(3, 7, 72)
    plain = onednn_linear_forward(lin, x)
    lin.weight = PackedWeight(linear._reorder(lin.weight), requires_grad=False)
    assert torch.equal(onednn_linear_forward(lin, x), plain)
    rows = x.reshape(-1, 72)
    for n in range(1, rows.shape[0] + 1):  # every row alone, or among n: the same bits
        assert torch.equal(onednn_linear_forward(lin, rows[:n]), plain.reshape(-1, 40)[:n])


def test_runtime_prepacks_weights_with_unchanged_logits_and_restore_stock_undoes_it(tok, linear_kernel):
    model = tiny_model(tok, seed=5)
    before = _weights(model)
    ids = tok.encode(TEXT, add_special_tokens=False)
    rt = _switched(model)
    packed_words = "15 of 15 weights packed" if linear_kernel == "fixed" else "15 of 15 weights prepacked"
    assert packed_words in rt.numerics and ("fixed-order" in rt.numerics) == (linear_kernel == "fixed")
    assert len(_packed(model)) == 15
    packed = _decode(model, ids)
    if linear_kernel == "onednn":
        unpack_linears(model)  # the same oneDNN kernel on the plain weights
        assert not _packed(model) and torch.equal(_decode(model, ids), packed)
    make_row_invariant(model)
    restore_stock(model)
    assert not _packed(model) and peek(model).numerics is None
    after = model.state_dict()
    assert all(torch.equal(after[k], v) and type(after[k]) is torch.Tensor for k, v in before.items())
    assert all(p.requires_grad for p in model.parameters())
    assert all(not m._state_dict_hooks for m in model.modules())
    assert packed_words in make_row_invariant(model)  # and again
    assert torch.equal(_decode(model, ids), packed)


def test_weights_tied_to_the_embeddings_stay_plain(tok, linear_kernel):
    model = tiny_model(tok, seed=6)
    model.lm_head.weight = model.model.embed_tokens.weight
    _switched(model)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert not isinstance(model.lm_head.weight, PackedWeight) and len(_packed(model)) == 14


def test_prepacking_that_fails_leaves_plain_weights(tok, monkeypatch):
    monkeypatch.setenv("SPECSTRUCT_LINEAR", "onednn")
    settings.cache_clear()
    def refuse(weight):
        raise RuntimeError("no oneDNN reorder in this build")

    monkeypatch.setattr(linear, "_reorder", refuse)
    model = tiny_model(tok, seed=7)
    rt = _switched(model)
    assert "0 of 15 weights prepacked (prepacking failed: RuntimeError)" in rt.numerics and rt.row_invariant
    assert not _packed(model) and rt.prefill([1, 2, 3]).shape == (rt.vocab_size,)


def test_quantize_draft_of_a_prepacked_model(tok, linear_kernel):
    model = tiny_model(tok, seed=8)
    plain_q = quantize_draft(copy.deepcopy(model))
    _switched(model)
    q = quantize_draft(model)
    assert len(_packed(model)) == 15  # the source keeps its packed weights
    ids = tok.encode(TEXT, add_special_tokens=False)
    assert torch.equal(_decode(q, ids), _decode(plain_q, ids))


def test_what_users_do_with_their_model_works_on_a_prepacked_one(tok, tmp_path, linear_kernel):
    model = tiny_model(tok, seed=9)
    before, fingerprint = _weights(model), weights_fingerprint(model)
    ids = tok.encode(TEXT, add_special_tokens=False)
    expected = _decode(model, ids)
    assert len(_packed(model)) == 15

    twin = copy.deepcopy(model)  # packed too, and independent
    assert len(_packed(twin)) == 15 and twin.lm_head.weight is not model.lm_head.weight
    assert torch.equal(_decode(twin, ids), expected)

    state = model.state_dict()  # plain tensors, as a checkpoint expects
    assert all(torch.equal(state[k], v) and not state[k].is_mkldnn for k, v in before.items())
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    loaded = torch.load(buf)
    assert all(torch.equal(loaded[k], v) for k, v in before.items())

    model.save_pretrained(tmp_path)
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).state_dict()
    assert all(torch.equal(reloaded[k], v) for k, v in before.items())

    other = tiny_model(tok, seed=10)
    model.load_state_dict(other.state_dict())  # new values, packed again
    assert len(_packed(model)) == 15 and torch.equal(model.lm_head.weight.to_dense(), other.lm_head.weight)
    model.load_state_dict(before)
    assert torch.equal(_decode(model, ids), expected)

    assert weights_fingerprint(model) == fingerprint
    draft = perturbed(model)
    assert not _packed(draft) and weights_fingerprint(draft) != fingerprint
    with pytest.raises(PackedWeightError, match="restore_stock"):
        twin.half()
    with pytest.raises(PackedWeightError, match="restore_stock"):
        twin.to(torch.bfloat16)
