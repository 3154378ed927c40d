"""A sequence's KV cache grows in place (packed.KVSequence): the same keys and values a transformers DynamicLayer
holds through appends and crops, few reallocations, and `layers()` hands out copies that later writes cannot touch."""

import torch
from transformers.cache_utils import DynamicLayer

from specstruct.runtime.packed import KVSequence
from specstruct.testing import tiny_model


def _kv(n, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(1, 2, n, 16, generator=gen), torch.randn(1, 2, n, 16, generator=gen)


def test_appends_and_crops_hold_what_a_dynamic_layer_holds_with_few_reallocations(tok):
    seq = KVSequence(tiny_model(tok).config)
    ours, plain = seq.cache.layers[0], DynamicLayer()
    buffers = set()
    for step, n in enumerate([40, 1, 1, 9, 3, 1] * 40):
        k, v = _kv(n, step)
        got = ours.update(k, v)
        want = plain.update(k, v)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        buffers.add(ours._kv_buffers[0].data_ptr())
        if step % 3 == 2:  # a rejected draft: drop the last positions, the next update writes over them
            ours.crop(-2)
            plain.crop(-2)
    assert ours.get_seq_length() == plain.get_seq_length() > 1000
    assert len(buffers) <= 12  # grown by a quarter when full, not copied at every step


def test_layers_are_copies_and_a_sequence_built_from_them_owns_its_memory(tok):
    config = tiny_model(tok).config
    seq = KVSequence(config)
    for layer in seq.cache.layers:
        layer.update(*_kv(10, 0))
    seq.length = 10
    held = seq.layers()
    seq.crop(8)
    for layer in seq.cache.layers:
        layer.update(*_kv(2, 1))  # overwrites positions 8 and 9 in place
    assert torch.equal(held[0][0], _kv(10, 0)[0])  # the copy handed out earlier is untouched
    again = KVSequence(config, held, 10)
    assert torch.equal(again.layers()[0][0], held[0][0])
    assert again.cache.layers[0]._kv_buffers[0].data_ptr() != held[0][0].data_ptr()
