"""The user's module is left as it was: SpecStruct(model, ...) and the runtime switch their own structural copy
(runtime/owned.py), whose tensors are the user's until the runtime packs them."""

from __future__ import annotations

import types

import pytest
import torch
from pydantic import BaseModel

import specstruct as ss
from specstruct.runtime import quantized
from specstruct.runtime.gguf_model import load_quantized
from specstruct.runtime.model_runtime import ModelRuntime
from specstruct.runtime.owned import hand_over, owned, peek, structural_copy
from specstruct.testing import OneSequence, tiny_model, write_gguf


class Flag(BaseModel):
    ok: bool


def _forward_of(mod: torch.nn.Module) -> object:
    forward = mod.forward
    return (forward.__func__, id(forward.__self__)) if isinstance(forward, types.MethodType) else forward


def _snapshot(model: torch.nn.Module) -> dict[str, object]:
    """Everything a runtime could change: each state-dict tensor's storage and values, each submodule's attribute
    names and the objects they hold (the contents of its parameter, buffer, module and hook dicts too), its
    forward, and the config the attention is chosen by."""
    modules = {}
    for name, mod in model.named_modules():
        attrs = {}
        for key, value in vars(mod).items():
            held = {k: id(v) for k, v in value.items()} if isinstance(value, dict) else None
            attrs[key] = (id(value), held)
        modules[name] = (type(mod), attrs, _forward_of(mod), mod.training)
    return {
        "state": {k: (v.data_ptr(), type(v), v.detach().clone()) for k, v in model.state_dict().items()},
        "params": {k: (id(p), p.requires_grad) for k, p in model.named_parameters(remove_duplicate=False)},
        "modules": modules,
        "config": (id(model.config), model.config.to_dict(), model.config._attn_implementation),
    }


def _assert_same(before: dict[str, object], after: dict[str, object]) -> None:
    state_before, state_after = before["state"], after["state"]
    assert isinstance(state_before, dict) and isinstance(state_after, dict)
    assert state_before.keys() == state_after.keys()
    for key, (ptr, kind, values) in state_before.items():
        ptr_after, kind_after, values_after = state_after[key]
        assert (ptr, kind) == (ptr_after, kind_after), key
        assert torch.equal(values, values_after), key
    for part in ("params", "modules", "config"):
        assert before[part] == after[part], part


def test_specstruct_leaves_the_users_models_as_they_were(tok):
    target, draft = tiny_model(tok, seed=21), tiny_model(tok, seed=22)
    target_before, draft_before = _snapshot(target), _snapshot(draft)
    engine = ss.SpecStruct(target, tok, draft_model=draft)
    assert "row-invariant" in engine.numerics  # the runtime did switch numerics: on its own modules
    assert isinstance(engine.run("Is the sky blue?", Flag, max_new_tokens=12).value, Flag)
    assert engine.runtime.model is not target
    assert engine.model is target  # SpecStruct.model is still the module the user passed
    _assert_same(target_before, _snapshot(target))
    _assert_same(draft_before, _snapshot(draft))
    assert not any(k.startswith("_specstruct") for m in target.modules() for k in vars(m))
    assert peek(target).numerics is None and not owned(target)
    with torch.inference_mode():  # and it computes as before: transformers' own forward, stock attention
        target(input_ids=torch.tensor([[5, 6, 7]]))
    engine.core.close()


def test_a_users_gguf_model_is_left_as_it_was(tok, tmp_path):
    """Blocks as they ship: the runtime fuses the copy's decoder layers and merges its q/k/v and gate/up weights, on
    weight objects of its own."""
    pytest.importorskip("gguf")
    try:
        quantized.kernel()
    except RuntimeError as e:
        pytest.skip(str(e))
    model = tiny_model(tok, seed=26)
    write_gguf(model, tmp_path / "tiny.gguf", "Q8_0")
    loaded = load_quantized(tmp_path / "tiny.gguf", model.config)
    before = _snapshot(loaded)
    weights = {name: (m.qweight, {k: id(v) for k, v in vars(m.qweight).items()}) for name, m in loaded.named_modules()
               if isinstance(m, quantized.QuantLinear)}
    seq = OneSequence(loaded)
    assert "row-invariant" in seq.numerics and seq.prefill([5, 6, 7]).shape == (seq.vocab_size,)
    _assert_same(before, _snapshot(loaded))
    for name, m in loaded.named_modules():
        if isinstance(m, quantized.QuantLinear):
            qweight, attrs = weights[name]
            assert m.qweight is qweight and {k: id(v) for k, v in vars(qweight).items()} == attrs, name


def test_a_runtime_over_a_users_model_switches_a_copy_that_shares_the_weights(tok):
    model = tiny_model(tok, seed=23)
    before = _snapshot(model)
    rt = ModelRuntime(model, row_invariant=False)  # stock numerics: nothing is packed, every tensor is shared
    assert rt.model is not model
    theirs = {k: v.data_ptr() for k, v in model.state_dict().items()}
    assert theirs == {k: v.data_ptr() for k, v in rt.model.state_dict().items()}
    _assert_same(before, _snapshot(model))
    seq = OneSequence(model)
    assert "row-invariant" in seq.numerics
    _assert_same(before, _snapshot(model))


def test_a_module_handed_over_is_switched_in_place(tok):
    model = tiny_model(tok, seed=24)
    hand_over(model)
    rt = ModelRuntime(model)
    assert rt.model is model and peek(model).numerics == rt.numerics
    assert ModelRuntime(model).model is model  # switched already: still the runtime's own


def test_the_structural_copy_keeps_ties_and_moves_bound_overrides(tok):
    model = tiny_model(tok, seed=25)
    model.lm_head.weight = model.model.embed_tokens.weight
    model.lm_head.forward = types.MethodType(torch.nn.Linear.forward, model.lm_head)  # a user's override
    copy = structural_copy(model)
    assert copy.lm_head.weight is copy.model.embed_tokens.weight
    assert copy.lm_head.weight is not model.lm_head.weight
    assert copy.lm_head.weight.data_ptr() == model.lm_head.weight.data_ptr()
    assert copy.lm_head.forward.__self__ is copy.lm_head
    assert copy.config is not model.config and all(
        getattr(m, "config", copy.config) is copy.config for m in copy.modules())
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.inference_mode():
        assert torch.equal(copy(input_ids=ids).logits, model(input_ids=ids).logits)
