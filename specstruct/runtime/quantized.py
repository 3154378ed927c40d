"""Block-quantized weights as they ship (GGUF Q8_0, Q6_K, Q5_K, Q5_1, Q5_0, Q4_K, Q4_1, Q4_0, IQ4_XS, IQ4_NL, Q3_K,
Q2_K), computed without widening them.

A GGUF tensor's blocks are decoded once (gguf_blocks.py) into unsigned integers per weight plus, per group of G
inputs of one output (the format's own sub-block: 32, or 16 for Q6_K, Q3_K, Q2_K), a scale and either a zero point
of the whole tensor or a min -- the format's values exactly, so `dequantize()` gives the `gguf` package's own
de-quantization -- and packed into the panels of csrc/blockq_linear.cpp. That kernel quantizes each input row on
its own to int8 per group and sums every output in an order fixed by the input size alone: a row's result is
bitwise independent of the other rows of the pass, as the float32 kernel's is (fixed_linear.py), so speculative
verification, batching and the prefix cache stay exact.

`QuantLinear` replaces an nn.Linear, `QuantEmbedding` an nn.Embedding (it de-quantizes only the rows looked up);
the rest of the model stays transformers' own. `quantize_float` makes the same layout from float weights
(`weights="q8_0"` for a model that ships in float).
"""

from __future__ import annotations

import copy
from collections import Counter

from pathlib import Path
from typing import Iterable, Protocol, cast

import numpy as np
import torch

from specstruct.runtime import native
from specstruct.runtime.gguf_blocks import DECODERS, Format
from specstruct.runtime.load_memory import empty_on_huge_pages

class BlockOps(Protocol):
    """What csrc/blockq_linear.cpp's extension provides here (tests and probes reach its other functions)."""

    simd: str

    def amx(self) -> bool: ...
    def linear(self, x: torch.Tensor, *weight_and_bias: object) -> torch.Tensor: ...
    def linear_panels(self, x: torch.Tensor, *weight_and_panels: object) -> torch.Tensor: ...
    def dequantize_rows(self, *weight_ids_and_shape: object) -> torch.Tensor: ...


_KERNEL = native.Kernel("specstruct_blockq_linear", Path(__file__).parent / "csrc" / "blockq_linear.cpp",
                        "the block-quantized Linear kernel", "quantized weights cannot be computed")
_PACKER = native.Kernel("specstruct_block_pack", Path(__file__).parent / "csrc" / "block_pack.cpp",
                        "the weight packer", "weights are packed with numpy and torch ops instead (slower loading)")
PANEL = 16  # outputs per panel (the kernel's panel_outputs)


def kernel() -> BlockOps:
    """The built extension; raises with the reason where it cannot be built (quantized weights need it)."""
    ext = _KERNEL.load()
    if ext is None:
        raise RuntimeError(f"{_KERNEL.error}; load the model with weights='float32' instead")
    return cast(BlockOps, ext)


def why_not() -> str | None:
    """Why the kernel cannot be built here (None: it is built)."""
    return None if _KERNEL.load() is not None else _KERNEL.error


def kernel_for(march: str) -> BlockOps:
    """This kernel's source built for another instruction set (native.Kernel.for_march)."""
    return cast(BlockOps, _KERNEL.for_march(march))


def simd() -> str:
    """The instruction set the kernel was built for ("avx512-vnni", "avx-vnni", "avx2" or "scalar")."""
    return kernel().simd


def amx() -> bool:
    """Whether products of 64 rows and more run on AMX int8 tiles here: the CPU lists AMX-INT8 and the OS granted
    this process the tile state (the same bits as the vector path either way)."""
    return bool(kernel().amx())


# ---------------------------------------------------------------- packing

def _zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return empty_on_huge_pages(shape, dtype).zero_()


class QuantWeight:
    """A [out, in] weight in the kernel's panels: `packed` [P, groups, bytes]; `scales` (and `mins`) [P, super-blocks,
    16] float16 (every format ships its scales in fp16); for K-quants `subscales` (and `submins`) [P, groups, 16] int8."""

    def __init__(self, fmt: Format, out_features: int, in_features: int):
        if in_features % (fmt.group * fmt.gps):
            raise ValueError(f"{fmt.name}: {in_features} inputs are not a multiple of the group size "
                             f"{fmt.group * fmt.gps}")
        self.fmt, self.out_features, self.in_features = fmt, out_features, in_features
        panels, groups = -(-out_features // PANEL), in_features // fmt.group
        # on transparent huge pages where the OS allows: a pass streams every weight once, and on 4 KiB pages the
        # TLB misses cost a pass of the 1.5B target 3-5% (python -m benchmarks.huge_pages)
        self.packed = _zeros((panels, groups, fmt.group * PANEL * fmt.bits // 8), torch.uint8)
        self.scales = _zeros((panels, groups // fmt.gps, PANEL), torch.float16)  # the file's own fp16
        self.mins = _zeros(self.scales.shape, torch.float16) if fmt.zero < 0 else None
        sub = fmt.gps > 1
        self.subscales = _zeros((panels, groups, PANEL), torch.int8) if sub else None
        self.submins = _zeros((panels, groups, PANEL), torch.int8) if sub and fmt.zero < 0 else None

    def tensors(self) -> dict[str, torch.Tensor | None]:
        return {"packed": self.packed, "scales": self.scales, "mins": self.mins, "subscales": self.subscales,
                "submins": self.submins}

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values() if t is not None)

    def fill(self, row0: int, u: np.ndarray, scale: np.ndarray, sub: np.ndarray | None, mins: np.ndarray | None,
             submins: np.ndarray | None) -> None:
        """Rows [row0, row0 + len(u)) (row0 a multiple of 16): u [rows, in] uint8; scale/mins [rows, super-blocks];
        sub/submins [rows, groups] int8 (K-quants)."""
        fmt, rows = self.fmt, u.shape[0]
        panels = -(-rows // PANEL)
        pad = panels * PANEL - rows
        p0 = row0 // PANEL

        def panelled(a: np.ndarray | None, dtype: type, fill: int = 0) -> torch.Tensor:  # [rows, n] -> [P, n, 16]
            assert a is not None, "the format's scales: the caller passes every array its format has"
            t = torch.from_numpy(np.ascontiguousarray(a, dtype=dtype))
            if pad:
                t = torch.cat([t, t.new_full((pad, t.shape[1]), fill)])
            return t.view(panels, PANEL, -1).permute(0, 2, 1)

        ut = torch.from_numpy(np.ascontiguousarray(u, dtype=np.uint8))
        packer = _PACKER.load()
        if packer is not None:  # one pass in C++, straight into the panels
            packer.pack(ut, self.packed[p0 : p0 + panels], fmt.group, fmt.bits, max(fmt.zero, 0))
        else:
            self.packed[p0 : p0 + panels] = pack_panels(fmt, ut, panels)
        self.scales[p0 : p0 + panels] = panelled(scale, np.float16)
        if self.mins is not None:
            self.mins[p0 : p0 + panels] = panelled(mins, np.float16)
        if self.subscales is not None:
            self.subscales[p0 : p0 + panels] = panelled(sub, np.int8)
        if self.submins is not None:
            self.submins[p0 : p0 + panels] = panelled(submins, np.int8)

    def args(self) -> tuple[object, ...]:
        """The kernel's arguments for this weight after x: packed, scales, mins, sub-scales, sub-mins, outputs, group,
        bits, zero, groups per super-block, table (`ext.linear(x, *w.args(), bias)`, `ext.linear_scalar(x, *w.args())`)."""
        f = self.fmt
        return (self.packed, self.scales, self.mins, self.subscales, self.submins, self.out_features, f.group, f.bits,
                f.zero, f.gps, f.lut)

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, in] float32 -> [M, out]."""
        f = self.fmt
        return cast(BlockOps, _KERNEL.module or kernel()).linear(x, self.packed, self.scales, self.mins, self.subscales,
                                                                 self.submins, self.out_features, f.group, f.bits,
                                                                 f.zero, f.gps, f.lut, bias)

    def linear_panels(self, x: torch.Tensor, panels: torch.Tensor) -> torch.Tensor:
        """x [M, in] float32 -> [M, PANEL * len(panels)]: only those panels' outputs, bitwise as `linear` gives them
        (no bias; a last partial panel's extra columns undefined)."""
        return kernel().linear_panels(x, *self.args(), panels)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The float32 weights of outputs `ids` (any shape) -> [*ids.shape, in]."""
        f = self.fmt
        flat = kernel().dequantize_rows(self.packed, self.scales, self.mins, self.subscales, self.submins,
                                        ids.reshape(-1), self.out_features, self.in_features, f.group, f.bits, f.zero,
                                        f.gps, f.lut)
        return flat.view(*ids.shape, self.in_features)

    def dequantize(self) -> torch.Tensor:
        return self.rows(torch.arange(self.out_features))


def pack_panels(fmt: Format, ut: torch.Tensor, panels: int) -> torch.Tensor:
    """Decoded values ut [rows, in] uint8 as the kernel's panels [panels, groups, bytes] (csrc/block_pack.cpp does
    the same in one pass; this is its reference and its fallback)."""
    groups, pad = ut.shape[1] // fmt.group, panels * PANEL - ut.shape[0]
    if pad:
        ut = torch.cat([ut, ut.new_full((pad, ut.shape[1]), max(fmt.zero, 0))])
    quads = ut.view(torch.int32).view(panels, PANEL, groups, fmt.group // 4)  # 4 inputs as one 32-bit word
    v = quads.permute(0, 2, 3, 1).contiguous().view(torch.uint8).view(panels, groups, fmt.group // 4, -1)
    if fmt.bits < 8:  # [P, ng, quads, 16 x 4 bytes]: a low plane of lb bits, 8 / lb quads per byte: quad i in
        lb = 4 if fmt.bits >= 4 else 2  # bits 0..lb-1, quad i + n in bits lb..2lb-1, ... (n quad vectors)
        n = fmt.group // 4 * lb // 8
        low = v & ((1 << lb) - 1)
        plane = low[:, :, :n].clone()
        for j in range(1, 8 // lb):
            plane |= low[:, :, j * n : (j + 1) * n] << (lb * j)
        planes = [plane.reshape(panels, groups, -1)]
        if fmt.bits > lb:  # bits lb and up: per quad vector and bit, a 64-bit mask with bit k for byte k
            high = np.stack([((v >> (lb + b)) & 1).numpy().astype(bool) for b in range(fmt.bits - lb)], axis=3)
            masks = np.packbits(high, axis=-1, bitorder="little")  # [P, ng, quads, bits - lb, 8]
            planes.append(torch.from_numpy(masks).reshape(panels, groups, -1))
        v = torch.cat(planes, dim=-1)
    return v.reshape(panels, groups, -1)


_CHUNK_ROWS = 4096  # rows decoded at a time: bounds the temporary numpy arrays of a large tensor (the LM head)


def _per_row(a: np.ndarray | None, rows: int) -> np.ndarray | None:
    return None if a is None else a.reshape(rows, -1)


def from_gguf_blocks(type_name: str, data: np.ndarray, out_features: int, in_features: int) -> QuantWeight:
    """A weight from a GGUF tensor's raw blocks (`GGUFReader` tensor `.data`, [out, bytes per row])."""
    if type_name not in DECODERS:
        raise ValueError(f"GGUF type {type_name} is not supported quantized (supported: {', '.join(DECODERS)})")
    block = DECODERS[type_name]
    decode, fmt, per_block, block_bytes = block.decode, block.fmt, block.weights, block.nbytes
    blocks_per_row = in_features // per_block
    raw = np.asarray(data).reshape(out_features, blocks_per_row * block_bytes)
    weight = QuantWeight(fmt, out_features, in_features)
    for r0 in range(0, out_features, _CHUNK_ROWS):
        part = raw[r0 : r0 + _CHUNK_ROWS]
        rows = part.shape[0]
        u, scale, sub, mins, submins = decode(part.reshape(rows * blocks_per_row, block_bytes))
        weight.fill(r0, u.reshape(rows, in_features), scale.reshape(rows, -1), _per_row(sub, rows),
                    _per_row(mins, rows), _per_row(submins, rows))
    return weight


def quantize_float(weight: torch.Tensor, name: str = "q8_0") -> QuantWeight:
    """Float weights [out, in] rounded to Q8_0's layout (32 inputs per scale, max |w| -> 127), as llama.cpp does."""
    if name != "q8_0":
        raise ValueError(f"weights={name!r}: only 'q8_0' quantization on load is supported")
    w = weight.detach().to(torch.float32)
    out_features, in_features = w.shape
    fmt = Format("q8_0", 32, 8, 128)
    if in_features % 32:
        raise ValueError(f"q8_0: {in_features} inputs are not a multiple of 32")
    result = QuantWeight(fmt, out_features, in_features)
    for r0 in range(0, out_features, _CHUNK_ROWS):
        g = w[r0 : r0 + _CHUNK_ROWS].reshape(-1, in_features // 32, 32)
        d = g.abs().amax(dim=-1) / 127  # as gguf's Q8_0: round(w / d), halves away from zero, d stored in fp16
        inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
        v = g * inv[..., None]
        q = (torch.sign(v) * torch.floor(v.abs() + 0.5)).clamp_(-127, 127).to(torch.int16) + 128
        d16 = d.to(torch.float16).to(torch.float32)
        result.fill(r0, q.to(torch.uint8).reshape(-1, in_features).numpy(), d16.reshape(q.shape[0], -1).numpy(),
                    None, None, None)
    return result


# ---------------------------------------------------------------- modules

class QuantLinear(torch.nn.Module):
    """nn.Linear's computation on a QuantWeight: y = x W^T + b. There is no `.weight` (a float32 copy would cost 4-7x
    the blocks): `qweight.dequantize()` makes one where it is really wanted."""

    bias: torch.Tensor | None

    def __init__(self, weight: QuantWeight, bias: torch.Tensor | None = None):
        super().__init__()
        self.qweight = weight
        self.in_features, self.out_features = weight.in_features, weight.out_features
        for name, t in weight.tensors().items():
            self.register_buffer(name, t)
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.float32).contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # called ~200 times a decode step: no needless ops
        if x.dtype != torch.float32:
            x = x.float()
        if x.dim() == 2:
            return self.qweight.linear(x, self.bias)
        y = self.qweight.linear(x.reshape(-1, x.shape[-1]), self.bias)
        return y.view(*x.shape[:-1], y.shape[-1])

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.qweight.fmt.name}"


def merge_linears(mods: list[QuantLinear]) -> tuple[QuantWeight, torch.Tensor | None] | None:
    """One weight computing several QuantLinears that read the same input (q, k, v; gate, up): their outputs side
    by side, in one kernel call that quantizes the input once. Each module's buffers become views of the merged
    tensors (no second copy). A row's outputs are bitwise what the separate calls give (each output is summed in
    its own fixed order). Returns the weight and its bias; None when their formats, inputs or biases differ, or a
    part is not whole panels."""
    first = mods[0].qweight
    same = all(m.qweight.fmt == first.fmt and m.in_features == first.in_features for m in mods)
    if len(mods) < 2 or not same or any(m.out_features % PANEL for m in mods[:-1]) \
            or len({m.bias is None for m in mods}) > 1:
        return None
    merged = QuantWeight(first.fmt, sum(m.out_features for m in mods), first.in_features)
    for name, whole in merged.tensors().items():
        if whole is None:
            continue
        row = 0
        for m in mods:  # each part straight into its rows (a torch.cat would hold a second merged copy)
            part = getattr(m.qweight, name)
            whole[row : row + len(part)].copy_(part)
            row += len(part)
    at = 0
    for m in mods:
        panels = -(-m.out_features // PANEL)
        m.qweight = copy.copy(m.qweight)  # the module's own: another module (a user's) may share the QuantWeight
        for name, whole in merged.tensors().items():
            if whole is not None:
                part = whole[at : at + panels]
                setattr(m.qweight, name, part)
                setattr(m, name, part)  # the module's registered buffer
        at += panels
    biases = [m.bias for m in mods if m.bias is not None]
    return merged, torch.cat(biases) if biases else None


class QuantEmbedding(torch.nn.Module):
    """nn.Embedding on a QuantWeight: each looked-up row de-quantized (times the model's embed_scale, if any)."""

    def __init__(self, weight: QuantWeight, embed_scale: torch.Tensor | None = None, padding_idx: int | None = None):
        super().__init__()
        self.qweight = weight
        self.num_embeddings, self.embedding_dim = weight.out_features, weight.in_features
        self.padding_idx = padding_idx
        for name, t in weight.tensors().items():
            self.register_buffer(name, t)
        self.embed_scale = embed_scale

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = self.qweight.rows(ids)
        return out if self.embed_scale is None else out * self.embed_scale.to(out.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.qweight.fmt.name}"


def describe(model: torch.nn.Module) -> str | None:
    """"Q4_K x196 + Q6_K x29 + ..." for a model with quantized layers, else None."""
    return format_counts(m.qweight.fmt.name for m in model.modules() if isinstance(m, (QuantLinear, QuantEmbedding)))


def format_counts(names: Iterable[str]) -> str | None:
    """"Q4_K x196 + Q6_K x29": how many weights of each format, the most common first; None for none."""
    counts = Counter(names)
    return " + ".join(f"{k} x{v}" for k, v in counts.most_common()) if counts else None


def is_quantized(model: torch.nn.Module) -> bool:
    return any(isinstance(m, (QuantLinear, QuantEmbedding)) for m in model.modules())
