"""Memory that loading a model leaves behind, given back: a weights file's mapping, and freed heap.

transformers maps a safetensors checkpoint into memory and its tensors point into that mapping. Prepacking
(linear.pack_linears) reads every Linear weight once and keeps its own copy; the plain weights are dropped, but
the few tensors still in the file (input embeddings, which a tied LM head reads every step; norms; biases) keep the
whole mapping open, and every page the packing read stays counted in the process's memory (6 GB of file pages
for Qwen2.5-Coder-1.5B, on top of the 6 GB packed copy). `own_mapped_tensors` copies those remaining tensors
into ordinary memory (the embeddings are most of it) so the mapping can close.

`page_out` asks the kernel to reclaim a file-backed tensor's pages at once (MADV_PAGEOUT: clean pages are dropped
and read again from the file if touched, nothing is lost): pack_linears calls it on each plain weight it has
replaced, so packing never holds both copies of every weight (the peak while loading the 1.5B target was its file
pages plus its packed copy).

`page_out_range` does the same for a range of a mapped GGUF file once its tensor is converted
(gguf_model.load_quantized), so loading never holds the whole file's pages beside the converted weights.

`trim_heap` hands freed heap back to the system; SpecStruct calls it once the models are loaded. Loading frees
float32 copies (the draft's, once it is int8) in pieces small enough that glibc keeps them.

Linux / glibc only (/proc/self/maps, malloc_trim); elsewhere both change nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from pathlib import Path

import torch


def file_ranges() -> list[tuple[int, int]]:
    """Address ranges of this process's file-backed mappings (start, end)."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[4] != "0" and not fields[5].startswith("["):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            out.append((start, end))
    return out


_PAGE = 4096
_MADV_PAGEOUT = 21  # Linux 5.4+; an older kernel answers EINVAL and the pages are simply left to the kernel


@functools.lru_cache(maxsize=None)  # find_library runs ldconfig (a subprocess): once, not per tensor
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


def in_file(t: torch.Tensor, ranges: list[tuple[int, int]]) -> bool:
    """Whether `t`'s storage lies in one of `ranges` (file_ranges()): a CPU tensor read from a mapped file."""
    if t.device.type != "cpu" or t.is_sparse or t.is_mkldnn:
        return False
    try:
        ptr = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # an opaque tensor (a packed weight) has no plain storage
        return False
    return any(a <= ptr < b for a, b in ranges)


def page_out_range(ptr: int, size: int) -> int:
    """Ask the kernel to reclaim the whole pages of [ptr, ptr + size) of a file mapping (MADV_PAGEOUT: clean pages
    are dropped and read again from the file if touched). Best effort; returns the bytes advised (0: none)."""
    libc = _libc()
    start, end = -(-ptr // _PAGE) * _PAGE, (ptr + size) // _PAGE * _PAGE
    if libc is None or end <= start:
        return 0
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return end - start if libc.madvise(start, end - start, _MADV_PAGEOUT) == 0 else 0


def page_out(t: torch.Tensor, ranges: list[tuple[int, int]] | None = None) -> int:
    """Ask the kernel to reclaim the whole pages of `t`'s storage when they belong to a file mapping (`ranges`:
    file_ranges(), read once by a caller doing many tensors). Best effort; returns the bytes advised (0: none)."""
    if not in_file(t, file_ranges() if ranges is None else ranges):
        return 0
    storage = t.untyped_storage()
    return page_out_range(storage.data_ptr(), storage.nbytes())  # only pages wholly inside the tensor


_HUGE = 2 << 20
_MADV_HUGEPAGE = 14


def empty_on_huge_pages(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialized tensor whose whole 2 MiB pages are advised as transparent huge pages
    (MADV_HUGEPAGE; Linux with THP in "madvise" mode, the common default), before anything touches them. A
    kernel streaming gigabytes of weights per pass then misses the TLB 512x less often: a pass of the 1.5B
    target's block-quantized weights is 3-5% faster (`python -m benchmarks.huge_pages`). Best effort: elsewhere the
    tensor is simply on ordinary pages."""
    t = torch.empty(shape, dtype=dtype)
    libc = _libc()
    ptr, size = t.data_ptr(), t.numel() * t.element_size()
    start, end = -(-ptr // _HUGE) * _HUGE, (ptr + size) // _HUGE * _HUGE
    if libc is not None and end > start:
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.madvise(start, end - start, _MADV_HUGEPAGE)
    return t


def own_mapped_tensors(model: torch.nn.Module) -> int:
    """Copy every parameter and buffer of `model` that lives in a file mapping into process memory; returns the
    bytes copied. Values, dtypes, tied parameters (one Parameter object, copied once) and requires_grad stay."""
    ranges = file_ranges()
    if not ranges:
        return 0
    copied = 0
    with torch.no_grad():
        for p in model.parameters():  # unique Parameter objects: a tied weight is seen once
            if in_file(p, ranges):
                p.data = p.data.clone()
                copied += p.numel() * p.element_size()
        for mod in model.modules():
            for name, b in list(mod._buffers.items()):
                if b is not None and in_file(b, ranges):
                    mod._buffers[name] = b.clone()
                    copied += b.numel() * b.element_size()
    return copied


def trim_heap() -> bool:
    """glibc's malloc_trim(0): return free heap pages to the system. False where there is no glibc."""
    libc = _libc()
    try:
        return bool(libc.malloc_trim(0)) if libc is not None else False
    except AttributeError:  # a C library without malloc_trim (musl)
        return False


def collect_and_trim() -> None:
    """Free what was just dropped (a transformers model is a reference cycle) and hand the heap back."""
    import gc

    gc.collect()
    trim_heap()
