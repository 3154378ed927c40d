"""The row-wise attention in C++ (csrc/row_attention.cpp, packed.py): the torch ops' computation to float32
precision, and a row's output bitwise the same alone, among any rows, or in a prompt cut anywhere; the runtime names
which attention runs and keeps it for the model's life."""

import pytest
import torch

from specstruct import settings
from specstruct.runtime import packed
from specstruct.testing import tiny_model, cpu_has
from specstruct.testing import OneSequence
from specstruct.runtime.owned import peek


@pytest.fixture
def kernel(attention_kernel):
    return attention_kernel


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


@pytest.fixture(params=[1, 2], ids=["1 thread", "2 threads"])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("shape", SHAPES)
def test_rows_in_tiles_are_the_bits_of_rows_at_a_time(kernel, shape, threads):
    """A prompt chunk's rows computed in tiles that share each key and value loaded: every row bitwise the row
    computed alone, for chunks that are not a multiple of the tile, on a cached prefix or none, tiles of any size
    (more than the kernel takes at once: it caps them); and a decode step's or a verification's few rows, one tile
    per KV head, on a cache longer than a block of values."""
    for lk, lq in [(29, 29), (64, 64), (100, 37), (300, 64), (9, 3), (270, 13), (1, 1), (300, 1), (200, 5)]:
        q, k, v = qkv(*shape, lk, lq, seed=lq)
        rows = kernel.attend(q, k, v, 0.3, 0, 0.0, 1)
        for i in (0, lq // 2, lq - 1):  # row at a time is each row alone, over the keys it sees
            seen = lk - lq + i + 1
            assert torch.equal(kernel.attend(q[:, :, i : i + 1], k[:, :seen], v[:, :seen], 0.3)[0], rows[i])
        for tile in (2, 3, 8, 16, 40):
            assert torch.equal(kernel.attend(q, k, v, 0.3, 0, 0.0, tile), rows), (lk, lq, tile)


def test_a_pass_of_no_rows_is_empty(kernel):
    q, k, v = qkv(2, 6, 128, 5, 0)
    for tile in (1, 8):
        assert kernel.attend(q, k, v, 0.3, 0, 0.0, tile).shape == (0, 12, 128)


@pytest.mark.parametrize("shape", [(2, 6, 128), (1, 4, 256), (2, 2, 16)])
@pytest.mark.parametrize("window,softcap", [(4, 0.0), (1, 0.0), (0, 2.0), (7, 1.5), (50, 0.0), (70, 1.5)])
def test_tiles_keep_sliding_windows_and_soft_caps_bitwise(kernel, shape, window, softcap, threads):
    """A prompt chunk (rows whose windows start at different keys within one tile), and a decode step's or a
    verification's few rows on a cache longer than a block of values."""
    for lk, lq in [(140, 70), (300, 1), (200, 9)]:
        q, k, v = qkv(*shape, lk, lq, seed=3)
        scaling = shape[2] ** -0.5 * 4
        rows = kernel.attend(q, k, v, scaling, window, softcap, 1)
        for tile in (3, 8, 16):
            assert torch.equal(kernel.attend(q, k, v, scaling, window, softcap, tile), rows), (lk, lq, tile)


def test_a_prefill_in_tiles_is_the_prefill_row_at_a_time(tok, kernel, monkeypatch):
    """The runtime's prompt chunks go through the tiles (packed.TILE_ROWS): the logits of every position are the
    same bits as with rows at a time, whatever the chunking."""
    ids = [(7 * i + 3) % 200 for i in range(90)]
    runs = {}
    for tile in (1, 8):
        monkeypatch.setattr(packed, "TILE_ROWS", tile)
        rt = OneSequence(tiny_model(tok, seed=4))
        rt.prefill_chunk = 40
        rt.prefill(ids[:50])
        runs[tile] = rt.extend(ids[50:])  # 40 rows on a 50-token cache: every position's logits
    assert torch.equal(runs[1], runs[8])


# Builds for other vector units than this CPU's: -march and the CPU flags it needs. AVX2 has FMA, as AVX-512 does:
# the same float operations lane for lane; the portable path (SSE2, no FMA) rounds each product on its own.
BUILDS = {"avx2": ("x86-64-v3", ("avx2", "fma", "f16c")), "portable": ("x86-64", ())}


@pytest.mark.parametrize("build", list(BUILDS))
def test_other_vector_units_give_tiles_the_bits_of_rows_at_a_time(kernel, build):
    march, needs = BUILDS[build]
    if not cpu_has(*needs):
        pytest.skip(f"this CPU cannot run a {build} build")
    other = packed._KERNEL.for_march(march)  # this CPU's build works and runs this one: a failure is a failure
    for shape in [(2, 6, 128), (2, 7, 64), (1, 4, 256)]:
        q, k, v = qkv(*shape, 100, 37, seed=5)
        rows = other.attend(q, k, v, 0.3, 0, 0.0, 1)
        assert torch.equal(other.attend(q, k, v, 0.3, 0, 0.0, 8), rows)
        for lq in (1, 9):  # a decode step's and a verification's rows, one tile per KV head
            assert torch.equal(other.attend(q[:, :, -lq:], k, v, 0.3, 0, 0.0, 8), rows[-lq:])
        assert torch.equal(other.attend(q, k, v, 0.3, 5, 1.5, 8), other.attend(q, k, v, 0.3, 5, 1.5, 1))
        if "fma" in needs:
            assert torch.equal(rows, kernel.attend(q, k, v, 0.3, 0, 0.0, 8))
