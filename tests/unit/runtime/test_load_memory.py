"""Memory that loading leaves behind (runtime/load_memory.py): a checkpoint loaded memory-mapped (transformers +
safetensors) stops pinning its file once the weights are prepacked (no parameter or buffer left in a file mapping,
values and ties kept), and freed heap goes back to the system."""

import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from specstruct.runtime.load_memory import file_ranges, in_file, own_mapped_tensors, trim_heap
from specstruct.runtime.model_runtime import make_row_invariant
from specstruct.testing import tiny_model, tiny_tokenizer
from specstruct.testing import OneSequence

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")


def _in_file(t: torch.Tensor) -> bool:
    return in_file(t, file_ranges())


def _plain_tensors(model):
    from specstruct.runtime.linear import PackedWeight

    params = [p for p in model.parameters() if not isinstance(p, PackedWeight)]
    return params + [b for b in model.buffers() if b is not None]


@pytest.fixture()
def mapped_model(tmp_path):
    tok = tiny_tokenizer()
    model = tiny_model(tok)
    model.config.tie_word_embeddings = True
    model.tie_weights()
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    if not any(_in_file(p) for p in loaded.parameters()):
        pytest.skip("this transformers build copied the checkpoint instead of mapping it")
    return loaded


def test_prepacking_releases_the_weights_file_and_keeps_values_and_ties(mapped_model):
    values = {k: v.clone() for k, v in mapped_model.state_dict().items()}
    assert any(_in_file(t) for t in _plain_tensors(mapped_model))
    make_row_invariant(mapped_model)
    assert not any(_in_file(t) for t in _plain_tensors(mapped_model))
    assert mapped_model.lm_head.weight is mapped_model.model.embed_tokens.weight  # still one tied Parameter
    after = mapped_model.state_dict()  # packed weights give their plain values here
    assert values.keys() == after.keys() and all(torch.equal(values[k], after[k]) for k in values)
    OneSequence(mapped_model).prefill(list(range(5, 25)))  # and it still decodes


def test_own_mapped_tensors_changes_nothing_for_a_model_in_memory():
    model = tiny_model(tiny_tokenizer())
    before = {k: v.data_ptr() for k, v in model.state_dict().items()}
    assert own_mapped_tensors(model) == 0
    assert before == {k: v.data_ptr() for k, v in model.state_dict().items()}


def test_trim_heap_gives_freed_heap_back_and_never_raises():
    assert trim_heap() in (True, False)


def test_page_out_keeps_a_mapped_tensors_values_and_skips_memory_that_is_not_a_file(mapped_model):
    from specstruct.runtime.load_memory import page_out

    w = mapped_model.model.layers[0].mlp.up_proj.weight
    before = w.detach().clone()
    assert page_out(w) >= 0 and torch.equal(w, before)  # reclaimed pages read back from the file, unchanged
    assert page_out(torch.ones(100_000)) == 0  # ordinary memory is never advised
