"""The header of a GGUF file (v2/v3): its metadata fields, tensor directory and where the tensor data starts,
read without decoding what is not asked for.

gguf's GGUFReader decodes every field into numpy arrays (a 151k-token vocabulary: seconds); this walks the
header with `struct` over the mapped file, keeps only the fields named in `want` (scalars, strings and arrays of
them) and skips the rest. `identity` is a digest of the header bytes and the file size: two copies of one file
share it, a file with other metadata or tensors does not (what the bare-file metadata cache is keyed by).
"""

from __future__ import annotations

import hashlib
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_LENGTH = struct.Struct("<Q")  # a string's length


@dataclass
class TensorInfo:
    name: str
    dims: list[int]     # GGUF order: the fastest-varying dimension first
    kind: int           # the GGML type number
    offset: int         # from the start of the tensor data


@dataclass
class Header:
    version: int
    alignment: int
    data_start: int     # the byte where the tensor data starts (a multiple of `alignment`)
    size: int           # the file's size in bytes
    tensors: list[TensorInfo] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)   # the fields asked for that the file has


class _Cursor:
    def __init__(self, buf, at: int = 0):
        self.buf, self.at = buf, at

    def unpack(self, fmt: str):
        out = struct.unpack_from("<" + fmt, self.buf, self.at)
        self.at += struct.calcsize("<" + fmt)
        return out[0] if len(out) == 1 else out

    def string(self) -> str:
        n = self.unpack("Q")
        self.at += n
        return bytes(self.buf[self.at - n : self.at]).decode("utf-8", "replace")

    def value(self, kind: int, keep: bool) -> Any:
        if kind == _STRING:
            if keep:
                return self.string()
            n = self.unpack("Q")
            self.at += n
            return None
        if kind == _ARRAY:
            inner, count = self.unpack("I"), self.unpack("Q")
            if inner in _SCALARS:
                fmt = f"{count}{_SCALARS[inner]}"
                if keep:
                    return list(self.unpack(fmt)) if count != 1 else [self.unpack(fmt)]
                self.at += struct.calcsize("<" + fmt)
                return None
            if inner == _STRING and not keep:  # a vocabulary's tokens and merges: skipped in a tight loop
                at, buf, length = self.at, self.buf, _LENGTH.unpack_from
                for _ in range(count):
                    at += 8 + length(buf, at)[0]
                self.at = at
                return None
            items = [self.value(inner, keep) for _ in range(count)]
            return items if keep else None
        if kind not in _SCALARS:
            raise ValueError(f"unknown GGUF value type {kind}")
        v = self.unpack(_SCALARS[kind])
        return v if keep else None


def read_header(path: str | Path, want: tuple[str, ...] = ()) -> Header:
    """The header of GGUF file `path`, with the metadata fields named in `want` decoded into `values`."""
    path = Path(path)
    with open(path, "rb") as f:
        size = path.stat().st_size
        if size < 24:
            raise ValueError(f"{path} is not a GGUF file (only {size} bytes)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            if mm[:4] != b"GGUF":
                raise ValueError(f"{path} is not a GGUF file (it does not start with the GGUF magic bytes)")
            c = _Cursor(mm, 4)
            version = c.unpack("I")
            if version not in (2, 3):
                raise ValueError(f"{path}: GGUF version {version} is not supported (2 or 3)")
            n_tensors, n_kv = c.unpack("Q"), c.unpack("Q")
            header = Header(version, 32, 0, size)
            try:
                for _ in range(n_kv):
                    key, kind = c.string(), c.unpack("I")
                    keep = key in want or key == "general.alignment"
                    value = c.value(kind, keep)
                    if key == "general.alignment":
                        header.alignment = int(value)
                    if key in want:
                        header.values[key] = value
                for _ in range(n_tensors):
                    name = c.string()
                    dims = [c.unpack("Q") for _ in range(c.unpack("I"))]
                    header.tensors.append(TensorInfo(name, dims, c.unpack("I"), c.unpack("Q")))
            except struct.error:
                raise ValueError(f"{path}: the GGUF header is cut short (a partial download?)") from None
            header.data_start = -(-c.at // header.alignment) * header.alignment
    return header


def identity(path: str | Path) -> str:
    """A digest of `path`'s header bytes (metadata and tensor directory) and its size."""
    header = read_header(path)
    digest = hashlib.sha256(str(header.size).encode())
    with open(path, "rb") as f:
        left = header.data_start
        while left > 0:
            chunk = f.read(min(left, 8 << 20))
            if not chunk:
                break
            digest.update(chunk)
            left -= len(chunk)
    return digest.hexdigest()[:24]
