"""Block-quantized weights (runtime/quantized.py, csrc/blockq_linear.cpp): each GGUF format decodes to exactly the
`gguf` package's own de-quantization; the kernel's product is within int8-activation rounding of the float
product; a row's result is bitwise the same alone or among any rows, at any place; the scalar path gives the same
bits as the vector one."""

import numpy as np
import pytest
import torch

from specstruct.runtime import quantized

gguf_quants = pytest.importorskip("gguf.quants")
from gguf import GGMLQuantizationType  # noqa: E402  (after the importorskip)


@pytest.fixture(scope="module")
def ext():
    try:
        return quantized.kernel()
    except RuntimeError as e:
        pytest.skip(str(e))


def random_blocks(name: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random GGUF blocks of `name` for a [rows, cols] tensor, with fp16 scales of a real model's size."""
    rng = np.random.default_rng(seed)
    _, _, per_block, block_bytes = quantized.DECODERS[name]
    raw = rng.integers(0, 256, size=(rows, cols // per_block * block_bytes), dtype=np.uint8)
    blocks = raw.reshape(-1, block_bytes)

    def scales(n):
        return rng.uniform(-0.05, 0.05, n).astype(np.float16).view(np.uint8).reshape(n, 2)

    where = {"Q4_K": [0, 2], "Q6_K": [208]}.get(name, [0])
    for at in where:
        blocks[:, at : at + 2] = scales(len(blocks))
    return raw


FORMATS = list(quantized.DECODERS)
# (outputs, inputs): a partial last panel, several panels, one and several groups / super-blocks
# last panels of 8, 16, 7, 4, 12 and 9 outputs: a half panel (AVX2), a whole one, part of the first half, part of
# the second
SHAPES = [(40, 256), (16, 512), (7, 256), (100, 768), (28, 256), (41, 512)]  # inputs: whole super-blocks of 256


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("shape", SHAPES)
def test_decoding_is_exactly_the_gguf_packages_dequantization(ext, name, shape):
    raw = random_blocks(name, *shape)
    reference = gguf_quants.dequantize(raw, getattr(GGMLQuantizationType, name)).reshape(shape)
    weight = quantized.from_gguf_blocks(name, raw, *shape)
    assert np.array_equal(weight.dequantize().numpy(), reference)
    rows = torch.tensor([[shape[0] - 1, 0], [3, 3]])
    assert torch.equal(weight.rows(rows), torch.from_numpy(reference)[rows])


@pytest.mark.parametrize("name", FORMATS)
def test_product_is_the_float_product_within_int8_activation_rounding(ext, name):
    shape = (100, 768)
    raw = random_blocks(name, *shape)
    weight = quantized.from_gguf_blocks(name, raw, *shape)
    dense = torch.from_numpy(gguf_quants.dequantize(raw, getattr(GGMLQuantizationType, name)).reshape(shape))
    torch.manual_seed(0)
    x, bias = torch.randn(13, shape[1]), torch.randn(shape[0])
    y, want = weight.linear(x, bias), x @ dense.T + bias
    assert ((y - want).norm() / want.norm()).item() < 0.02


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("shape", SHAPES)
def test_a_row_is_the_same_bits_alone_or_among_any_rows(ext, name, shape):
    weight = quantized.from_gguf_blocks(name, random_blocks(name, *shape, seed=1), *shape)
    torch.manual_seed(1)
    x = torch.randn(21, shape[1]) * torch.logspace(-2, 2, 21)[:, None]  # rows of very different scales
    x[4] = 0  # an all-zero row (zero activation scale)
    x[5] = torch.arange(shape[1]) % 9 - 3.5  # halves: ties when quantized (max 127 in each group: scale 1)
    x[5, ::16] = 127
    every = weight.linear(x)
    for n in range(1, 22):
        assert torch.equal(weight.linear(x[:n]), every[:n])  # among the first n
        assert torch.equal(weight.linear(x[n - 1 : n]), every[n - 1 : n])  # alone
    shuffled = torch.randperm(21)
    assert torch.equal(weight.linear(x[shuffled]), every[shuffled])  # at another place
    if ext.simd == "scalar":
        return  # the vector path is the scalar one on this CPU: nothing more to compare
    f = weight.fmt
    scalar = ext.linear_scalar(x, weight.packed, weight.scales, weight.mins, weight.subscales, weight.submins,
                               shape[0], f.group, f.bits, f.zero, f.gps)
    assert torch.equal(scalar, every)  # the portable path: the same float operations in the same order


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("shape", SHAPES)
def test_some_panels_alone_are_the_same_bits_as_in_the_whole_product(ext, name, shape):
    weight = quantized.from_gguf_blocks(name, random_blocks(name, *shape, seed=2), *shape)
    torch.manual_seed(2)
    x = torch.randn(11, shape[1])
    every = weight.linear(x)
    last = (shape[0] - 1) // quantized.PANEL
    for chosen in ([last], [0], list(range(last + 1)), [last, 0, last]):  # a partial panel, any order, repeats
        panels = torch.tensor(chosen)
        cols = (panels[:, None] * quantized.PANEL + torch.arange(quantized.PANEL)).flatten()
        valid = cols < shape[0]
        for rows in (x[:1], x[3:5], x):
            got = weight.linear_panels(rows, panels)
            assert got.shape == (len(rows), quantized.PANEL * len(chosen))
            assert torch.equal(got[:, valid], weight.linear(rows)[:, cols[valid]])
        assert torch.equal(weight.linear_panels(x, panels)[:, valid], every[:, cols[valid]])
    with pytest.raises(RuntimeError, match="out of range"):
        weight.linear_panels(x, torch.tensor([last + 1]))


def test_float_weights_round_to_q8_0_as_gguf_does(ext):
    torch.manual_seed(2)
    w = torch.randn(48, 256)
    ours = quantized.quantize_float(w).dequantize()
    theirs = gguf_quants.dequantize(gguf_quants.quantize(w.numpy(), GGMLQuantizationType.Q8_0),
                                    GGMLQuantizationType.Q8_0).reshape(48, 256)
    assert torch.equal(ours, torch.from_numpy(theirs))
    assert ((ours - w).norm() / w.norm()).item() < 0.01


def test_bad_shapes_are_refused_with_the_reason(ext):
    with pytest.raises(ValueError, match="multiple of the group size"):
        quantized.QuantWeight(quantized.DECODERS["Q8_0"][1], 16, 40)
    with pytest.raises(ValueError, match="not supported"):
        quantized.from_gguf_blocks("IQ2_XXS", np.zeros((1, 1), np.uint8), 1, 256)


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q8_0"])
def test_merged_projections_are_the_same_bits_as_separate_calls(ext, name):
    shapes = [(48, 512), (16, 512), (40, 512)]  # q, k, v: whole panels, then a partial last one
    mods = [quantized.QuantLinear(quantized.from_gguf_blocks(name, random_blocks(name, *s, seed=i), *s),
                                  torch.randn(s[0])) for i, s in enumerate(shapes)]
    x = torch.randn(9, 512)
    apart = [m(x) for m in mods]
    weight, bias = quantized.merge_linears(mods)
    together = weight.linear(x, bias)
    assert torch.equal(together, torch.cat(apart, dim=1))
    assert all(torch.equal(m(x), a) for m, a in zip(mods, apart))  # the modules now read views of the merged blocks
    assert mods[0].packed.data_ptr() == weight.packed.data_ptr()  # no second copy
    assert quantized.merge_linears(mods[:1]) is None
    other = quantized.QuantLinear(quantized.from_gguf_blocks("Q5_0", random_blocks("Q5_0", 16, 512), 16, 512),
                                  torch.randn(16))
    assert quantized.merge_linears([mods[0], other]) is None  # formats differ
    assert quantized.merge_linears([mods[2], mods[0]]) is None  # a partial panel before the last part


def _cpu_has(*flags: str) -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            line = next((x for x in f if x.startswith("flags")), "")
    except OSError:
        return False
    return set(flags) <= set(line.split())


# Builds for other vector units than this CPU's: (-march and flags, the simd it names, the CPU flags it needs)
BUILDS = {"avx2": ("x86-64-v3", ("avx2", "fma", "f16c")),  # most laptops and desktops
          "avx-vnni": ("x86-64-v3 -mavxvnni", ("avx2", "fma", "f16c", "avx_vnni"))}


@pytest.fixture(scope="module", params=list(BUILDS))
def other_build(request):
    """The same source built for AVX2 (pair sums) or AVX-VNNI (256-bit VPDPBUSD) without AVX-512."""
    march, needs = BUILDS[request.param]
    if not _cpu_has(*needs):
        pytest.skip(f"this CPU cannot run a {request.param} build")
    if quantized.why_not():
        pytest.skip(quantized.why_not())
    ext = quantized.kernel_for(march)  # this CPU's build works and runs this one: a failure is a failure
    assert ext.simd == request.param
    return ext


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("shape", SHAPES)
def test_other_vector_units_give_the_same_bits_as_this_cpus_build_and_the_scalar_path(ext, other_build, name, shape):
    """A model's output must not depend on the machine's vector unit: the AVX2 and AVX-VNNI builds (exact integer
    sums, the same float operations lane for lane) against this CPU's build and the portable path, every row."""
    avx2 = other_build
    weight = quantized.from_gguf_blocks(name, random_blocks(name, *shape, seed=3), *shape)
    f = weight.fmt
    args = (weight.packed, weight.scales, weight.mins, weight.subscales, weight.submins, shape[0], f.group, f.bits,
            f.zero, f.gps)
    torch.manual_seed(3)
    x = torch.randn(13, shape[1]) * torch.logspace(-2, 2, 13)[:, None]
    x[4] = 0
    x[5] = torch.arange(shape[1]) % 9 - 3.5
    x[5, ::16] = 127
    x[6] = 127 * torch.sign(torch.randn(shape[1]))  # every activation at +-127: the int16 pair sums' extremes
    want = ext.linear_scalar(x, *args)
    assert torch.equal(avx2.linear(x, *args, None), want) and torch.equal(ext.linear(x, *args, None), want)
    for n in (1, 2, 3, 6, 7, 9):  # blocks of 1-2 rows (both halves at once), up to 6 (AVX2), up to 12 (AVX-512)
        assert torch.equal(avx2.linear(x[:n], *args, None), want[:n])
    assert torch.equal(avx2.linear(x[7:8], *args, None), want[7:8])


@pytest.mark.parametrize("name", FORMATS)
def test_the_integer_sums_at_their_extremes_give_the_same_bits_everywhere(ext, other_build, name):
    """Every weight at its format's largest code (or Q8_0's -128) against activations all +127 or all -127: the
    int16 pair sums of the AVX2 path at their bounds (32512 for 8 bits; 30480, 31496, 32004 for 4, 5, 6 bits)."""
    shape = (41, 512)
    raw = random_blocks(name, *shape, seed=4)
    blocks = raw.reshape(-1, quantized.DECODERS[name][3])
    scales = {"Q4_K": [0, 1, 2, 3], "Q6_K": [208, 209]}.get(name, [0, 1])  # the fp16 scales stay as they are
    codes = [i for i in range(blocks.shape[1]) if i not in scales]
    blocks[:, codes] = 0x80 if name == "Q8_0" else 0xFF  # Q8_0: int8 -128; the others: every bit of the code set
    weight = quantized.from_gguf_blocks(name, raw, *shape)
    f = weight.fmt
    args = (weight.packed, weight.scales, weight.mins, weight.subscales, weight.submins, shape[0], f.group, f.bits,
            f.zero, f.gps)
    x = torch.stack([torch.ones(shape[1]), -torch.ones(shape[1]), torch.ones(shape[1]) * 3])
    want = ext.linear_scalar(x, *args)
    assert torch.isfinite(want).all()
    assert torch.equal(other_build.linear(x, *args, None), want) and torch.equal(ext.linear(x, *args, None), want)
    assert torch.equal(other_build.linear(x[1:2], *args, None), want[1:2])
