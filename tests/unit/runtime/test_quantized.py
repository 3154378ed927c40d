"""Block-quantized weights (runtime/quantized.py, csrc/blockq_linear.cpp): each GGUF format decodes to exactly the
`gguf` package's own de-quantization; the kernel's product is within int8-activation rounding of the float
product; a row's result is bitwise the same alone or among any rows, at any place; the scalar path gives the same
bits as the vector one."""

import os

import numpy as np
import pytest
import torch

from specstruct.runtime import quantized
from specstruct.testing import cpu_has

gguf_quants = pytest.importorskip("gguf.quants")
from gguf import GGMLQuantizationType  # noqa: E402  (after the importorskip)


@pytest.fixture(scope="module")
def ext():
    try:
        return quantized.kernel()
    except RuntimeError as e:
        pytest.skip(str(e))


def random_blocks(name: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random GGUF blocks of `name` for a [rows, cols] tensor, with fp16 scales (and mins) of a real model's size."""
    rng = np.random.default_rng(seed)
    block = quantized.DECODERS[name]
    raw = rng.integers(0, 256, size=(rows, cols // block.weights * block.nbytes), dtype=np.uint8)
    blocks = raw.reshape(-1, block.nbytes)
    for at in block.halves:
        blocks[:, at : at + 2] = rng.uniform(-0.05, 0.05, len(blocks)).astype(np.float16).view(np.uint8).reshape(-1, 2)
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
    scalar = ext.linear_scalar(x, *weight.args())
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


def test_the_iq4_table_is_the_gguf_packages(ext):
    assert tuple(ext.iq4nl_values) == gguf_quants.IQ4_NL.kvalues


def test_every_format_is_held_in_about_the_files_bytes_per_weight(ext):
    """The packed planes and scales against the file's own blocks: at most the small integer sub-scales of Q2_K and
    Q3_K (4 and 6 bits in the file) held as bytes, and fp16 scales per panel row."""
    shape = (64, 1024)
    for name, block in quantized.DECODERS.items():
        weight = quantized.from_gguf_blocks(name, random_blocks(name, *shape), *shape)
        file_bytes = shape[0] * shape[1] // block.weights * block.nbytes
        assert file_bytes <= weight.nbytes <= file_bytes * (1.2 if name in ("Q2_K", "Q3_K") else 1.03), name


def test_bad_shapes_are_refused_with_the_reason(ext):
    with pytest.raises(ValueError, match="multiple of the group size"):
        quantized.QuantWeight(quantized.DECODERS["Q8_0"].fmt, 16, 40)
    with pytest.raises(ValueError, match="not supported"):
        quantized.from_gguf_blocks("IQ2_XXS", np.zeros((1, 1), np.uint8), 1, 256)


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q8_0", "Q2_K", "IQ4_XS", "Q5_1"])
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
    other = quantized.QuantLinear(quantized.from_gguf_blocks("Q5_K", random_blocks("Q5_K", 16, 512), 16, 512),
                                  torch.randn(16))
    assert quantized.merge_linears([mods[0], other]) is None  # formats differ
    assert quantized.merge_linears([mods[2], mods[0]]) is None  # a partial panel before the last part


# Builds for other vector units than this CPU's: (-march and flags, the simd it names, the CPU flags it needs)
BUILDS = {"avx2": ("x86-64-v3", ("avx2", "fma", "f16c")),  # most laptops and desktops
          "avx-vnni": ("x86-64-v3 -mavxvnni", ("avx2", "fma", "f16c", "avx_vnni"))}


@pytest.fixture(scope="module", params=list(BUILDS))
def other_build(request):
    """The same source built for AVX2 (pair sums) or AVX-VNNI (256-bit VPDPBUSD) without AVX-512."""
    march, needs = BUILDS[request.param]
    if not cpu_has(*needs):
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
    args = weight.args()
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


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q8_0", "IQ4_XS"])
def test_a_prefill_of_several_row_blocks_gives_the_scalar_paths_bits(ext, name):
    """37 rows: several full row blocks of every build (6 on AVX2, 16 on AVX-512) and a shorter last one, each row
    the same bits as the portable path computes it alone."""
    shape = (48, 768)
    weight = quantized.from_gguf_blocks(name, random_blocks(name, *shape, seed=5), *shape)
    args = weight.args()
    torch.manual_seed(5)
    x = torch.randn(37, shape[1]) * torch.logspace(-2, 2, 37)[:, None]
    x[20] = 0
    got = ext.linear(x, *args, None)
    assert torch.equal(got, ext.linear_scalar(x, *args))
    for n in (1, 17, 33):
        assert torch.equal(ext.linear(x[n : n + 1], *args, None), got[n : n + 1])


@pytest.mark.parametrize("name", FORMATS)
def test_the_integer_sums_at_their_extremes_give_the_same_bits_everywhere(ext, other_build, name):
    """Every weight at its format's largest code (Q8_0's -128, the IQ4 table's -127) against activations all +127 or
    all -127: the int16 pair sums of the AVX2 path at their bounds (32512 for 8 bits, 32258 for the IQ4 table;
    30480, 31496, 32004 for 4, 5, 6 bits)."""
    shape = (41, 512)
    raw = random_blocks(name, *shape, seed=4)
    block = quantized.DECODERS[name]
    blocks = raw.reshape(-1, block.nbytes)
    scales = {at + i for at in block.halves for i in (0, 1)}  # the fp16 scales stay as they are
    codes = [i for i in range(blocks.shape[1]) if i not in scales]
    blocks[:, codes] = {"Q8_0": 0x80, "IQ4_NL": 0, "IQ4_XS": 0}.get(name, 0xFF)  # every bit of the others' codes set
    weight = quantized.from_gguf_blocks(name, raw, *shape)
    args = weight.args()
    x = torch.stack([torch.ones(shape[1]), -torch.ones(shape[1]), torch.ones(shape[1]) * 3])
    want = ext.linear_scalar(x, *args)
    assert torch.isfinite(want).all()
    assert torch.equal(other_build.linear(x, *args, None), want) and torch.equal(ext.linear(x, *args, None), want)
    assert torch.equal(other_build.linear(x[1:2], *args, None), want[1:2])


@pytest.mark.parametrize("quant", ["Q4_1", "Q5_1"])
def test_a_file_in_an_affine_format_loads_with_its_blocks_kept(ext, tmp_path, tok, quant):
    """A GGUF file whose weights gguf's own writer quantized (Q4_1, Q5_1: a min per group): every Linear on the
    kernel in that format, the logits the float model's within quantization and activation rounding."""
    from specstruct.runtime.gguf_model import load_quantized
    from specstruct.testing import tiny_model, write_gguf

    model = tiny_model(tok)
    path = tmp_path / f"tiny-{quant}.gguf"
    stands_for = write_gguf(model, path, quant)
    loaded = load_quantized(path, model.config)
    assert not any(isinstance(m, torch.nn.Linear) for m in loaded.modules())
    assert quantized.describe(loaded).startswith(quant)
    ids = torch.tensor([tok.encode('{"name": "Ada", "tags": ["math"]}', add_special_tokens=False)])
    with torch.inference_mode():
        want, got = stands_for(input_ids=ids).logits, loaded(input_ids=ids).logits
    assert ((got - want).norm() / want.norm()).item() < 0.03


def test_a_format_the_kernel_does_not_compute_is_refused_by_name(ext, tmp_path, tok, monkeypatch):
    """A tensor below 3 bits (IQ2_XXS here) is never widened silently: the error names the file's tensor, its type,
    the formats that run and the fix."""
    from specstruct.runtime import gguf_model
    from specstruct.testing import tiny_model, write_gguf

    model = tiny_model(tok)
    path = tmp_path / "tiny.gguf"
    write_gguf(model, path, "Q8_0")
    read = gguf_model.read_tensors

    def relabelled(p):
        tensors = read(p)
        for t in tensors:
            if t.name == "blk.0.ffn_down.weight":
                t.kind = "IQ2_XXS"
        return tensors

    monkeypatch.setattr(gguf_model, "read_tensors", relabelled)
    with pytest.raises(ValueError, match=r"blk\.0\.ffn_down\.weight is IQ2_XXS.*Q2_K.*IQ4_XS.*weights='float32'"):
        gguf_model.load_quantized(path, model.config)


# (outputs, inputs) for the AMX tiles: groups per row not a multiple of the four in flight (3, 5; 8 for K-quants),
# partial last panels
TILE_SHAPES = {"whole": [(40, 256), (23, 768)], "groups": [(40, 96), (9, 160)]}


@pytest.mark.parametrize("name", FORMATS)
def test_the_amx_tiles_give_the_vector_paths_bits_in_blocks_of_16_rows(ext, name):
    """Where AMX is granted, products of many rows run on tiles of 16 rows (the last block padded): every row
    the same bits as the AVX-512 path and the portable path, full blocks and a ragged last one, and a row alone."""
    if not ext.amx():
        pytest.skip("no AMX tiles on this machine (not listed, or not granted by the OS)")
    fmt = quantized.DECODERS[name].fmt
    shapes = TILE_SHAPES["whole"] + ([] if fmt.gps > 1 else TILE_SHAPES["groups"])
    fewest = ext.amx_min_rows(16)  # from one tile of rows (the runtime starts at more, where the tiles pay)
    try:
        _tiles_match(ext, name, shapes)
    finally:
        ext.amx_min_rows(fewest)


def _tiles_match(ext, name, shapes):
    for shape in shapes:
        weight = quantized.from_gguf_blocks(name, random_blocks(name, *shape, seed=6), *shape)
        args = weight.args()
        torch.manual_seed(6)
        x = torch.randn(53, shape[1]) * torch.logspace(-2, 2, 53)[:, None]
        x[18] = 0
        x[40] = 127 * torch.sign(torch.randn(shape[1]))
        want = ext.linear_scalar(x, *args)
        for n in (16, 17, 31, 32, 53):  # one block, a block and one row, two blocks, a ragged third
            assert torch.equal(ext.linear(x[:n], *args, None), want[:n]), (shape, n)
        was = ext.use_amx(False)
        try:
            assert torch.equal(ext.linear(x, *args, None), want)  # the AVX-512 path
        finally:
            ext.use_amx(was)
        assert torch.equal(ext.linear(x[37:38], *args, None), want[37:38])  # alone: the vector path
        panels = torch.tensor([(shape[0] - 1) // quantized.PANEL, 0])
        cols = (panels[:, None] * quantized.PANEL + torch.arange(quantized.PANEL)).flatten()
        valid = cols < shape[0]
        assert torch.equal(ext.linear_panels(x, *args, panels)[:, valid], want[:, cols[valid]])


def _vm_flags(addr: int) -> list[str] | None:
    """The VmFlags of the mapping of this process holding `addr` (/proc/self/smaps), None where there is none."""
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(a, 16) for a in head.split("-"))
            inside = lo <= addr < hi
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    return None


@pytest.mark.skipif(not (os.path.exists("/proc/self/smaps") and os.path.exists("/sys/kernel/mm/transparent_hugepage")),
                    reason="Linux with transparent huge pages")
def test_packed_weights_are_advised_onto_huge_pages():
    # a pass streams every weight once: on 4 KiB pages the TLB misses slow it (python -m benchmarks.huge_pages)
    w = quantized.from_gguf_blocks("Q4_K", random_blocks("Q4_K", 8192, 1024), 8192, 1024)
    assert w.packed.numel() >= 4 << 20  # holds a whole 2 MiB page wherever it starts
    inner = -(-w.packed.data_ptr() // (2 << 20)) * (2 << 20)  # the first whole 2 MiB page inside it
    flags = _vm_flags(inner)
    assert flags is not None and "hg" in flags  # MADV_HUGEPAGE
