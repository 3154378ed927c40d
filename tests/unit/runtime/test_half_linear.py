"""16-bit weights as they ship (runtime/half_linear.py on csrc/fixed_linear.cpp): each value widened exactly, so a
product is bitwise the float32 kernel's on the widened weights and within float32 rounding of the exact one; a row
is the same bits alone or among any rows; the AVX2 and portable builds give this CPU's bits; a F16 / BF16 GGUF
file loads with its Linear and embedding weights kept 16-bit, close to the float model of the same weights."""

import pytest
import torch

from specstruct import settings
from specstruct.runtime import fixed_linear
from specstruct.runtime.half_linear import HalfEmbedding, HalfLinear, HalfWeight, describe
from specstruct.testing import OneSequence, tiny_llama, tiny_model, write_gguf, cpu_has

DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16}
SHAPES = [(72, 40), (100, 33), (5, 1), (64, 300), (129, 515)]  # (out, in): vector and panel tails, 1-3 block sums


@pytest.fixture(autouse=True)
def _built(monkeypatch):
    monkeypatch.setenv("SPECSTRUCT_LINEAR", "fixed")
    settings.cache_clear()
    if fixed_linear.kernel() is None:
        pytest.skip(fixed_linear.why_not())


def _weight(dtype: torch.dtype, out: int, inp: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(out, inp, generator=gen) * torch.logspace(-3, 1, inp)).to(dtype)
    if dtype == torch.float16 and w.numel() > 8:  # subnormal and extreme halves widen exactly too
        w.view(-1)[:4] = torch.tensor([6e-8, -3e-5, 65504.0, -0.0], dtype=dtype)
    return w


def _rows(inp: int, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(23, inp, generator=gen) * torch.logspace(-2, 2, 23)[:, None]
    x[3] = 0
    return x


@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_the_product_is_the_float32_kernels_on_the_widened_weights_and_close_to_the_exact_one(name, shape):
    w = _weight(DTYPES[name], *shape)
    weight = HalfWeight.pack(w)
    assert weight.packed.dtype == DTYPES[name] and weight.name == name
    assert torch.equal(weight.dequantize(), w.float())  # widened exactly, every row (panel tails included)
    x = _rows(shape[1])
    bias = torch.randn(shape[0])
    ours = weight.linear(x, bias)
    widened = fixed_linear.kernel().linear(x, fixed_linear.pack_weight(w.float()), shape[0], bias)
    assert torch.equal(ours, widened)
    exact = x.double() @ w.double().T + bias.double()
    stock = torch.nn.functional.linear(x, w.float(), bias)
    assert (ours.double() - exact).abs().max() <= 2 * (stock.double() - exact).abs().max() + 1e-6


@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_a_row_is_the_same_bits_alone_or_among_any_rows(name, shape):
    layer = HalfLinear(HalfWeight.pack(_weight(DTYPES[name], *shape)))
    x = _rows(shape[1])
    with torch.no_grad():
        every = layer(x)
        for n in range(1, 24):
            assert torch.equal(layer(x[:n]), every[:n])
            assert torch.equal(layer(x[n - 1 : n]), every[n - 1 : n])
        shuffled = torch.randperm(23)
        assert torch.equal(layer(x[shuffled]), every[shuffled])
        assert torch.equal(layer(x.reshape(23, 1, -1)), every.reshape(23, 1, -1))
        assert layer(x[:0]).shape == (0, shape[0])


def test_an_embedding_widens_the_rows_looked_up():
    w = _weight(torch.bfloat16, 131, 24)
    emb = HalfEmbedding(HalfWeight.pack(w), embed_scale=torch.tensor(2.0))
    ids = torch.tensor([[0, 130, 64], [63, 65, 7]])
    assert torch.equal(emb(ids), w.float()[ids] * 2)


def test_other_dtypes_are_refused_by_name():
    with pytest.raises(ValueError, match="float16 or bfloat16, not torch.float32"):
        HalfWeight.pack(torch.zeros(4, 4))
    with pytest.raises(ValueError, match="GGUF type Q4_K is not a 16-bit float"):
        HalfWeight.from_gguf("Q4_K", None, 4, 4)


# builds for other vector units than this CPU's: -march, the simd the build names, the CPU flags it needs
BUILDS = {"avx2": ("x86-64-v3", ("avx2", "fma", "f16c")), "scalar": ("x86-64", ())}


@pytest.fixture(scope="module", params=list(BUILDS))
def other_build(request):
    march, needs = BUILDS[request.param]
    if not cpu_has(*needs):
        pytest.skip(f"this CPU cannot run a {request.param} build")
    if fixed_linear.kernel() is None:
        pytest.skip(fixed_linear.why_not())
    ext = fixed_linear.kernel_for(march)
    assert ext.simd == request.param
    return ext


@pytest.mark.parametrize("name", DTYPES)
def test_other_vector_units_give_the_same_bits(other_build, name):
    """A model's output must not depend on the machine's vector unit: the AVX2 build and the portable one against
    this CPU's build, on 16-bit and float32 panels (each packed for its build's panel width)."""
    shape = (129, 515)
    w = _weight(DTYPES[name], *shape)
    x = _rows(shape[1])
    for weights in (w, w.float()):
        ours = fixed_linear.kernel().linear(x, fixed_linear.pack_weight(weights), shape[0], None)
        packed = fixed_linear.pack_weight(weights, other_build.panel_width)
        assert torch.equal(other_build.linear(x, packed, shape[0], None), ours)
        for n in (1, 2, 3, 7):
            assert torch.equal(other_build.linear(x[:n], packed, shape[0], None), ours[:n])


# ---------------------------------------------------------------- GGUF files with F16 / BF16 weights

pytest.importorskip("gguf")


@pytest.fixture(scope="module", params=[("qwen2", "F16"), ("llama", "BF16"), ("tied", "BF16")])
def pair(request, tmp_path_factory, tok):
    """(the float model the file's weights stand for, the model loaded from the file)."""
    pytest.importorskip("accelerate")
    from specstruct.runtime.gguf_model import load_quantized

    arch, kind = request.param
    model = tiny_llama(tok) if arch == "llama" else tiny_model(tok)
    if arch == "tied":  # no output.weight in the file: the LM head computes on the embedding's panels
        model.config.tie_word_embeddings = True
        model.lm_head.weight = model.model.embed_tokens.weight
    path = tmp_path_factory.mktemp("gguf") / f"tiny-{arch}-{kind}.gguf"
    stands_for = write_gguf(model, path, kind)
    return stands_for, load_quantized(path, model.config), kind


def test_every_linear_and_the_embedding_stay_16_bit(pair):
    _, loaded, kind = pair
    assert not any(isinstance(m, torch.nn.Linear) for m in loaded.modules())
    assert isinstance(loaded.get_input_embeddings(), HalfEmbedding)
    if loaded.config.tie_word_embeddings:
        assert loaded.get_output_embeddings().packed is loaded.get_input_embeddings().packed
    assert all(m.packed.dtype == DTYPES[kind] for m in loaded.modules() if isinstance(m, HalfLinear))
    assert describe(loaded).startswith(f"{kind} x")
    numerics = OneSequence(loaded).numerics
    assert numerics.startswith(f"{kind} x") and "16-bit linear, fixed-order kernel" in numerics
    assert "row-invariant" in numerics


def test_the_logits_are_the_float_models_of_the_same_weights(pair):
    stands_for, loaded, _ = pair
    ids = torch.tensor([[5, 17, 90, 3, 44, 8]])
    with torch.no_grad():
        want = stands_for(input_ids=ids).logits
        got = loaded(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_row_decodes_the_same_alone_or_after_any_prefix_chunking(pair):
    _, loaded, _ = pair
    seq = OneSequence(loaded)
    ids = [5, 17, 90, 3, 44, 8, 19, 2, 77]
    whole = seq.prefill(ids)
    seq.prefill_chunk = 4
    assert torch.equal(seq.prefill(ids), whole)
