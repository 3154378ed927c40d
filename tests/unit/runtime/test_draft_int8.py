"""A draft in weight-only int8 on the fixed-order kernel (runtime/draft_int8.py): the dequantized weights'
results to float32 precision, close to the float32 model, and what quantize_draft gives where the kernel is built
(torch.ao's dynamic int8 otherwise, or when asked)."""

import pytest
import torch

from specstruct import settings
from specstruct.runtime import fixed_linear
from specstruct.runtime.draft_int8 import Int8Linear
from specstruct.runtime.model_runtime import quantize_draft
from specstruct.testing import tiny_model
from specstruct.testing import OneSequence
from specstruct.runtime.owned import peek


@pytest.fixture(autouse=True)
def _built(monkeypatch):
    monkeypatch.setenv("SPECSTRUCT_LINEAR", "fixed")
    settings.cache_clear()
    if fixed_linear.kernel() is None:
        pytest.skip(fixed_linear.why_not())


@pytest.mark.parametrize("shape", [(40, 72), (33, 100), (515, 129)])
def test_int8_linear_computes_with_the_rounded_weights(shape):
    torch.manual_seed(0)
    lin = torch.nn.Linear(*shape)
    q = Int8Linear(lin)
    x = torch.randn(3, 5, shape[0])
    y = q(x)
    assert y.shape == (3, 5, shape[1]) and q.packed.dtype == torch.int8
    assert q.scale.shape == (shape[1],)
    rounded = torch.round(lin.weight / q.scale[:, None]).clamp(-127, 127) * q.scale[:, None]
    torch.testing.assert_close(y, torch.nn.functional.linear(x, rounded, lin.bias), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        exact = lin(x)
    assert ((y - exact).norm() / exact.norm()) < 0.01  # int8 rounding, per output row
    zero = torch.nn.Linear(4, 3, bias=False)
    torch.nn.init.zeros_(zero.weight)
    assert torch.equal(Int8Linear(zero)(torch.randn(2, 4)), torch.zeros(2, 3))  # no division by a zero scale


@pytest.mark.parametrize("shape", [(40, 72), (515, 129)])
def test_int8_rows_are_the_same_bits_alone_or_in_a_prefill(shape):
    """The int8 kernel is row-invariant as the float32 one is: blocks of 6 rows, tails, a prefill-sized call."""
    torch.manual_seed(1)
    q = Int8Linear(torch.nn.Linear(*shape))
    x = torch.randn(40, shape[0])
    every = q(x)
    for n in (1, 5, 6, 7, 13, 40):
        assert torch.equal(q(x[:n]), every[:n])
    for i in range(40):
        assert torch.equal(q(x[i : i + 1]), every[i : i + 1])


def test_quantize_draft_uses_the_kernel_and_keeps_torch_ao_on_request(tok):
    model = tiny_model(tok, seed=11)
    ids = [5, 6, 7, 8, 9]
    ours, ao = quantize_draft(model), quantize_draft(model, torchao=True)
    assert "weight-only" in peek(ours).draft_numerics and "torch.ao" in peek(ao).draft_numerics
    assert not any(isinstance(m, torch.nn.Linear) for m in ours.modules())
    assert all(isinstance(p, torch.nn.Parameter) and not isinstance(p, fixed_linear.PackedWeight)
               for p in model.parameters())  # the source model is untouched
    full, q8 = OneSequence(model).prefill(ids), OneSequence(ours).prefill(ids)
    assert torch.argmax(full) == torch.argmax(q8) and ((q8 - full).norm() / full.norm()) < 0.05


def test_the_weight_only_draft_counts_as_row_invariant_and_torch_ao_does_not(tok):
    """So seeded sampling rows share the batched draft passes, and the draft's prompt KV is reused from the prefix
    cache, with the default int8 draft; torch.ao's (per-tensor activation scale) keeps both off."""
    model = tiny_model(tok, seed=11)
    ours, ao = OneSequence(quantize_draft(model)), OneSequence(quantize_draft(model, torchao=True))
    assert ours.row_invariant and ours.reuses_prefixes
    assert not ao.row_invariant and not ao.reuses_prefixes
