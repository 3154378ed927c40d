"""The row-wise attention in C++ (csrc/row_attention.cpp, packed.py): the torch ops' computation to float32
precision, and a row's output bitwise the same alone, among any rows, or in a prompt cut anywhere; the runtime names
which attention runs and keeps it for the model's life."""

import pytest
import torch

from specstruct import settings
from specstruct.runtime import packed
from specstruct.testing import tiny_model
from specstruct.testing import OneSequence
from specstruct.runtime.owned import peek


@pytest.fixture
def kernel():
    ext = packed._KERNEL.load()
    if ext is None:
        pytest.skip(packed._KERNEL.error)
    return ext


# (KV heads, query heads per KV head, head size): Qwen2.5-Coder-1.5B (2, 6, 128), 0.5B (2, 7, 64), the tiny test
# models (2, 2, 16), Gemma 3 270M (1, 4, 256), and sizes no template covers (one float at a time)
SHAPES = [(2, 6, 128), (2, 7, 64), (2, 2, 16), (1, 3, 32), (1, 4, 256), (3, 1, 8), (1, 2, 40)]


def qkv(h, g, d, lk, lq, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(h, g, lq, d, generator=gen), torch.randn(h, lk, d, generator=gen),
            torch.randn(h, lk, d, generator=gen))


@pytest.mark.parametrize("shape", SHAPES)
def test_the_kernel_computes_the_torch_ops_attention(kernel, shape):
    for lk, lq in [(1, 1), (17, 9), (40, 40), (300, 3)]:
        q, k, v = qkv(*shape, lk, lq)
        scaling = shape[2] ** -0.5
        torch.testing.assert_close(kernel.attend(q, k, v, scaling), packed._attend_rows_torch(q, k, v, scaling),
                                   rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("shape", SHAPES)
def test_a_row_is_the_same_bits_alone_among_other_rows_or_in_any_chunk(kernel, shape):
    lk, lq = 50, 12
    q, k, v = qkv(*shape, lk, lq, seed=1)
    whole = kernel.attend(q, k, v, 0.3)
    for i in range(lq):  # row i alone: its query, the keys it sees
        seen = lk - lq + i + 1
        assert torch.equal(kernel.attend(q[:, :, i : i + 1], k[:, :seen], v[:, :seen], 0.3)[0], whole[i])
    for cut in (1, 5, 11):  # a prompt read in two chunks, the second one's rows among fewer others
        first = kernel.attend(q[:, :, :cut], k[:, : lk - lq + cut], v[:, : lk - lq + cut], 0.3)
        second = kernel.attend(q[:, :, cut:], k, v, 0.3)
        assert torch.equal(torch.cat([first, second]), whole)


def masked_reference(q, k, v, scaling, window, softcap):
    """The whole block as one masked softmax, as transformers' eager attention computes it: scores scaled, capped,
    then a causal (and sliding-window) mask added."""
    h, g, lq, d = q.shape
    lk = k.shape[1]
    scores = torch.einsum("hgqd,hkd->hgqk", q.double(), k.double()) * scaling
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    pos_q, pos_k = torch.arange(lk - lq, lk)[:, None], torch.arange(lk)[None, :]
    visible = (pos_k <= pos_q) & ((pos_k > pos_q - window) if window else True)
    p = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
    return torch.einsum("hgqk,hkd->qhgd", p, v.double()).reshape(lq, h * g, d).float()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("window,softcap", [(4, 0.0), (1, 0.0), (0, 2.0), (7, 1.5), (100, 0.0)])
def test_sliding_windows_and_soft_caps(kernel, shape, window, softcap):
    lk, lq = 40, 9
    q, k, v = qkv(*shape, lk, lq, seed=2)
    scaling = shape[2] ** -0.5 * 4  # scores of a few units: the cap bites
    whole = kernel.attend(q, k, v, scaling, window, softcap)
    want = masked_reference(q, k, v, scaling, window, softcap)
    torch.testing.assert_close(whole, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(packed._attend_rows_torch(q, k, v, scaling, window, softcap), want, rtol=1e-4, atol=1e-5)
    for i in range(lq):  # row i alone, over only the keys of its window: the same bits
        end = lk - lq + i + 1
        first = max(0, end - window) if window else 0
        alone = kernel.attend(q[:, :, i : i + 1], k[:, first:end], v[:, first:end], scaling, 0, softcap)[0]
        assert torch.equal(alone, whole[i])
        assert torch.equal(kernel.attend(q[:, :, i : i + 1], k[:, :end], v[:, :end], scaling, window, softcap)[0],
                           whole[i])


def test_strided_queries_and_extreme_scores(kernel):
    q, k, v = qkv(2, 6, 128, 30, 8)
    sliced = q.transpose(2, 3).contiguous().transpose(2, 3)  # same values, other strides
    assert torch.equal(kernel.attend(sliced, k, v, 1.0), kernel.attend(q, k, v, 1.0))
    big = kernel.attend(q * 300, k, v, 1.0)  # scores in the thousands: softmax still finite, rows sum to one
    assert torch.isfinite(big).all()
    torch.testing.assert_close(big, packed._attend_rows_torch(q * 300, k, v, 1.0), rtol=1e-4, atol=1e-4)


def test_the_runtime_names_the_attention_and_keeps_it(tok, kernel, monkeypatch):
    ids = [5, 6, 7, 8, 9]
    cpp = OneSequence(tiny_model(tok, seed=4))
    assert "row-wise attention in C++" in cpp.numerics
    monkeypatch.setenv("SPECSTRUCT_ATTENTION", "torch")
    settings.cache_clear()
    torch_ops = OneSequence(tiny_model(tok, seed=4))
    assert "row-wise attention in torch ops" in torch_ops.numerics
    torch.testing.assert_close(cpp.prefill(ids), torch_ops.prefill(ids), rtol=1e-4, atol=1e-4)
    again = cpp.extend([10, 11])  # the env changed: a model keeps the attention its cache was built with
    cpp.crop(len(ids))
    assert torch.equal(cpp.extend([10, 11]), again) and peek(cpp.model).attention == "cpp"
    monkeypatch.setenv("SPECSTRUCT_ATTENTION", "flash")
    settings.cache_clear()
    with pytest.raises(ValueError, match="SPECSTRUCT_ATTENTION='flash' is not a row-wise attention; use one of"):
        packed.attention_kernel()


def test_without_the_kernel_attention_runs_as_torch_ops(tok, monkeypatch):
    monkeypatch.setattr(packed._KERNEL, "module", None)
    monkeypatch.setattr(packed._KERNEL, "error", "the row-wise attention kernel could not be built (no compiler)")
    rt = OneSequence(tiny_model(tok, seed=4))
    assert "row-wise attention in torch ops" in rt.numerics and rt.row_invariant
    rt.prefill([5, 6, 7])
