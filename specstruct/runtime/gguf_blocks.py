"""GGUF weight blocks decoded, exactly, into the integers and scales the block-quantized kernel computes on.

Each decoder takes a tensor's raw blocks [n, bytes per block] and gives, per weight, an unsigned integer u and, per
group of G inputs, the format's own scale (and min) -- so that w = scale * (u - zero) or w = scale * u - min is
bit for bit the `gguf` package's `dequantize`. K-quants and IQ4_XS keep their two levels: an fp16 per super-block
of 256 inputs times a small integer per group. IQ4_NL and IQ4_XS keep their 4-bit codes (u is the code): the
kernel looks them up in kvalues_iq4nl (`Format.lut`). The packing into the kernel's panels is quantized.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

QK_K = 256


@dataclass(frozen=True)
class Format:
    """How a tensor's weights are held: w = scale * (u - zero), or w = scale * u - min where zero is -1."""

    name: str   # the GGUF type it came from ("Q4_K"), or "q8_0" for float weights quantized on load
    group: int  # inputs per scale
    bits: int   # 2, 3, 4, 5, 6 or 8 per weight
    zero: int   # the zero point, or -1: a min per group
    gps: int = 1  # groups per super-block: >1, a group's scale is a float32 per super-block times an int8 per group
    lut: bool = False  # u is a 4-bit code standing for kvalues_iq4nl[u] + 128 (zero 128)


Decoded = tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None]


@dataclass(frozen=True)
class BlockType:
    """A GGUF block type: its decoder, the layout it decodes to, and its blocks' shape."""

    decode: Callable[[np.ndarray], Decoded]  # blocks -> (u, scale, sub-scale or None, min or None, sub-min or None)
    fmt: Format
    weights: int  # per block
    nbytes: int   # per block
    halves: tuple[int, ...]  # byte offsets of the block's fp16 scales (tests and benchmarks write valid ones there)


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Blocks of 32 weights as ggml's 4-bit formats pack them: [n, 16 bytes] -> [n, 32], low nibbles first."""
    return np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=1)


def _bits(b: np.ndarray, n: int) -> np.ndarray:
    """Bit i of `b` (bytes [m, n // 8], little-endian) as [m, n] uint8."""
    return np.unpackbits(np.ascontiguousarray(b), axis=1, bitorder="little")[:, :n]


def _pairs(qs: np.ndarray) -> np.ndarray:
    """K-quants' 2-bit planes: [n, 64] bytes -> [n, 256], 32 bytes a half, shifts 0, 2, 4, 6 in turn."""
    n = qs.shape[0]
    out = qs.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    return (out & np.uint8(3)).reshape(n, QK_K)


# Each decoder: blocks [n, bytes] -> (u [n, weights per block] uint8, scale [n, super-blocks], sub-scale [n, groups]
# int8 or None, min, sub-min): the group scale is scale * sub-scale (or scale where there is no sub-scale).
def _q8_0(blocks: np.ndarray) -> Decoded:
    d, qs = _f16(blocks[:, :2]), blocks[:, 2:]
    return qs ^ np.uint8(0x80), d, None, None, None  # int8 q + 128 as unsigned


def _q4_0(blocks: np.ndarray) -> Decoded:
    return _nibbles(blocks[:, 2:]), _f16(blocks[:, :2]), None, None, None


def _q4_1(blocks: np.ndarray) -> Decoded:  # w = d * q + m: the min held negated (exact in fp16), w = d * q - (-m)
    return _nibbles(blocks[:, 4:]), _f16(blocks[:, :2]), None, -_f16(blocks[:, 2:4]), None


def _q5_0(blocks: np.ndarray) -> Decoded:
    high = _bits(blocks[:, 2:6], 32)
    return _nibbles(blocks[:, 6:]) | (high << np.uint8(4)), _f16(blocks[:, :2]), None, None, None


def _q5_1(blocks: np.ndarray) -> Decoded:
    high = _bits(blocks[:, 4:8], 32)
    return _nibbles(blocks[:, 8:]) | (high << np.uint8(4)), _f16(blocks[:, :2]), None, -_f16(blocks[:, 2:4]), None


# Q4_K and Q5_K: d, dmin, 6-bit scales and mins per group of 32
def _k_scales(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from gguf.quants import Q4_K

    sc, m = Q4_K.get_scale_min(blocks[:, 4:16])
    return _f16(blocks[:, :2]), sc.view(np.int8), _f16(blocks[:, 2:4]), m.view(np.int8)


def _k_nibbles(qs: np.ndarray) -> np.ndarray:  # [n, 128] -> [n, 256]: 32 bytes per 64 weights, low nibbles first
    n = qs.shape[0]
    out = qs.reshape(n, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (out & np.uint8(0x0F)).reshape(n, QK_K)


def _q4_k(blocks: np.ndarray) -> Decoded:
    d, sc, dmin, m = _k_scales(blocks)
    return _k_nibbles(blocks[:, 16:]), d, sc, dmin, m


def _q5_k(blocks: np.ndarray) -> Decoded:
    d, sc, dmin, m = _k_scales(blocks)
    high = _bits(blocks[:, 16:48], 8 * 32).reshape(-1, 32, 8).transpose(0, 2, 1).reshape(-1, QK_K)  # bit i: 32i + l
    return _k_nibbles(blocks[:, 48:]) | (high << np.uint8(4)), d, sc, dmin, m


def _q6_k(blocks: np.ndarray) -> Decoded:
    n = blocks.shape[0]
    ql, qh, sc, d = blocks[:, :128], blocks[:, 128:192], blocks[:, 192:208], _f16(blocks[:, 208:210])
    low = (ql.reshape(n, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & np.uint8(0x0F)
    high = (qh.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & np.uint8(3)
    u = low.reshape(n, QK_K) | (high.reshape(n, QK_K) << np.uint8(4))
    return u, d, np.ascontiguousarray(sc).view(np.int8), None, None


def _q3_k(blocks: np.ndarray) -> Decoded:  # q = low2 - 4 where the hmask bit is clear: u = low2 | hbit << 2, zero 4
    n = blocks.shape[0]
    high = _bits(blocks[:, :32], 8 * 32).reshape(n, 32, 8).transpose(0, 2, 1).reshape(n, QK_K)
    s = blocks[:, 96:108]
    low4 = (s[:, :8].reshape(n, 1, 8) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)).reshape(n, 16)
    high2 = (s[:, 8:].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 4, 1)).reshape(n, 16)
    sc = ((low4 & np.uint8(0x0F)) | ((high2 & np.uint8(3)) << np.uint8(4))).astype(np.int8) - np.int8(32)
    return _pairs(blocks[:, 32:96]) | (high << np.uint8(2)), _f16(blocks[:, 108:110]), sc, None, None


def _q2_k(blocks: np.ndarray) -> Decoded:  # w = d * sc * q - dmin * m, 4-bit sc and m per group of 16
    s = blocks[:, :16]
    sc, m = (s & np.uint8(0x0F)).view(np.int8), (s >> np.uint8(4)).view(np.int8)
    return _pairs(blocks[:, 16:80]), _f16(blocks[:, 80:82]), sc, _f16(blocks[:, 82:84]), m


def _iq4_nl(blocks: np.ndarray) -> Decoded:
    return _nibbles(blocks[:, 2:]), _f16(blocks[:, :2]), None, None, None


def _iq4_xs(blocks: np.ndarray) -> Decoded:  # d, 6-bit signed scales per 32 (4 low bits in scales_l, 2 high in scales_h)
    n = blocks.shape[0]
    high = blocks[:, 2:4].copy().view(np.uint16) >> (2 * np.arange(8, dtype=np.uint16))[None, :]
    low = (blocks[:, 4:8].reshape(n, 4, 1) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2)).reshape(n, 8)
    sc = ((low & np.uint8(0x0F)) | ((high.astype(np.uint8) & np.uint8(3)) << np.uint8(4))).astype(np.int8) - np.int8(32)
    u = _nibbles(blocks[:, 8:].reshape(n * 8, 16)).reshape(n, QK_K)
    return u, _f16(blocks[:, :2]), sc, None, None


IQ4 = 128  # the table's values + 128 are unsigned bytes

DECODERS: dict[str, BlockType] = {
    "Q8_0": BlockType(_q8_0, Format("Q8_0", 32, 8, 128), 32, 34, (0,)),
    "Q4_0": BlockType(_q4_0, Format("Q4_0", 32, 4, 8), 32, 18, (0,)),
    "Q4_1": BlockType(_q4_1, Format("Q4_1", 32, 4, -1), 32, 20, (0, 2)),
    "Q5_0": BlockType(_q5_0, Format("Q5_0", 32, 5, 16), 32, 22, (0,)),
    "Q5_1": BlockType(_q5_1, Format("Q5_1", 32, 5, -1), 32, 24, (0, 2)),
    "IQ4_NL": BlockType(_iq4_nl, Format("IQ4_NL", 32, 4, IQ4, lut=True), 32, 18, (0,)),
    "Q2_K": BlockType(_q2_k, Format("Q2_K", 16, 2, -1, gps=16), QK_K, 84, (80, 82)),
    "Q3_K": BlockType(_q3_k, Format("Q3_K", 16, 3, 4, gps=16), QK_K, 110, (108,)),
    "Q4_K": BlockType(_q4_k, Format("Q4_K", 32, 4, -1, gps=8), QK_K, 144, (0, 2)),
    "Q5_K": BlockType(_q5_k, Format("Q5_K", 32, 5, -1, gps=8), QK_K, 176, (0, 2)),
    "Q6_K": BlockType(_q6_k, Format("Q6_K", 16, 6, 32, gps=16), QK_K, 210, (208,)),
    "IQ4_XS": BlockType(_iq4_xs, Format("IQ4_XS", 32, 4, IQ4, gps=8, lut=True), QK_K, 136, (0,)),
}
