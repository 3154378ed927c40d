"""The C++ packer (csrc/block_pack.cpp) writes every format's panels byte for byte as the numpy/torch reference
(quantized.pack_panels) does, for a last panel short of rows too, and a weight loaded from blocks is the same either
way."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specstruct.runtime import quantized
from specstruct.runtime.gguf_blocks import DECODERS


@pytest.fixture(scope="module")
def packer():
    ext = quantized._PACKER.load()
    if ext is None:
        pytest.skip(quantized._PACKER.error)
    return ext


@pytest.mark.parametrize("name", sorted(DECODERS))
@pytest.mark.parametrize("rows", [16, 37])
def test_the_packer_writes_the_references_bytes(packer, name, rows):
    fmt = DECODERS[name].fmt
    inputs = fmt.group * fmt.gps * 2
    u = torch.from_numpy(np.random.default_rng(rows).integers(0, 1 << fmt.bits, (rows, inputs), dtype=np.uint8))
    panels = -(-rows // quantized.PANEL)
    want = quantized.pack_panels(fmt, u, panels)
    got = torch.full_like(want, 0xA5)
    packer.pack(u, got, fmt.group, fmt.bits, max(fmt.zero, 0))
    assert torch.equal(got, want)


@pytest.mark.parametrize("name", ["Q6_K", "Q4_K", "Q3_K"])
def test_a_weight_from_blocks_is_the_same_with_either_packer(packer, monkeypatch, name):
    block = DECODERS[name]
    rows, cols = 40, 512
    blocks = np.random.default_rng(1).integers(0, 256, (rows, cols // block.weights * block.nbytes), dtype=np.uint8)
    fast = quantized.from_gguf_blocks(name, blocks, rows, cols)
    monkeypatch.setattr(quantized._PACKER, "module", None)
    monkeypatch.setattr(quantized._PACKER, "error", "off for this test")
    slow = quantized.from_gguf_blocks(name, blocks, rows, cols)
    for key, t in fast.tensors().items():
        other = slow.tensors()[key]
        assert (t is None and other is None) or torch.equal(t.view(torch.uint8), other.view(torch.uint8)), key
