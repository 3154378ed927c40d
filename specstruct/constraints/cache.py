"""Where compiled constraints and token tables are cached on disk (atomic writes, pruned to a size), and the
byte-bounded LRU that holds compiled constraints in memory.

Nothing read back from disk is unpickled: an entry is raw bytes behind a header (magic, format version, kind, length,
SHA-256 of the payload; `seal` / `read_entry`), decoded by its owner without running code (outlines_core's
`Index.from_binary`, JSON). A file that is not such an entry, of another kind or version, truncated or altered, is
deleted, logged once per kind, and rebuilt by the caller."""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Callable, TypeVar

from specstruct.settings import settings

log = logging.getLogger("specstruct.cache")

MAGIC = b"SPECSTRUCT-CACHE"
ENTRY_FORMAT = 1
_HEADER = struct.Struct(">16sH16sQ32s")  # magic, format, kind (NUL-padded), payload length, sha256(payload)
_WARNED: set[str] = set()
T = TypeVar("T")


def cache_dir() -> Path:
    """`$SPECSTRUCT_CACHE/constraints`, default `~/.cache/specstruct/constraints`."""
    return settings().cache / "constraints"


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file and a rename, so readers never see half a file.
    A read-only or full cache only costs compile time: errors are swallowed."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        pass


def seal(kind: str, payload: bytes) -> bytes:
    """`payload` as a cache entry of `kind` (at most 16 ASCII characters): header + payload."""
    return _HEADER.pack(MAGIC, ENTRY_FORMAT, kind.encode("ascii"), len(payload),
                        hashlib.sha256(payload).digest()) + payload


def unseal(kind: str, data: bytes) -> bytes:
    """The payload of an entry `seal(kind, ...)` wrote; ValueError saying what is wrong otherwise."""
    if len(data) < _HEADER.size:
        raise ValueError("shorter than the entry header")
    magic, fmt, stored_kind, length, digest = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ValueError("not a specstruct cache entry (a file of another program, or an old pickle)")
    stored_kind = stored_kind.rstrip(b"\0").decode("ascii", "replace")
    if fmt != ENTRY_FORMAT or stored_kind != kind:
        raise ValueError(f"an entry of format {fmt} kind {stored_kind!r}, not {ENTRY_FORMAT} {kind!r}")
    payload = data[_HEADER.size:]
    if len(payload) != length or hashlib.sha256(payload).digest() != digest:
        raise ValueError("truncated or altered (length or checksum mismatch)")
    return payload


def read_entry(path: Path, kind: str, decode: Callable[[bytes], T]) -> tuple[T, int] | None:
    """(decode(payload), file size) of the cache entry at `path`, or None when there is none. An entry that does not
    check out or decode (foreign, stale, corrupt) is deleted and logged (once per kind): the caller rebuilds it."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        value = decode(unseal(kind, data))
    except Exception as exc:  # noqa: BLE001 - any bad entry is discarded and rebuilt, never fatal
        discard(path, kind, exc)
        return None
    try:
        os.utime(path)  # recently used: pruned last
    except OSError:
        pass
    return value, len(data)


def discard(path: Path, kind: str, why: BaseException) -> None:
    """Delete a bad cache entry, saying so once per kind per process."""
    if kind not in _WARNED:
        _WARNED.add(kind)
        log.warning("specstruct: discarded the %s cache entry %s (%s: %s); it is rebuilt (further bad entries of "
                    "this kind are discarded silently)", kind, path, type(why).__name__, why)
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def prune_disk(folder: Path, max_bytes: int, pattern: str = "*.index") -> None:
    """Delete the least recently used files matching `pattern` under `folder` until they fit in `max_bytes`."""
    try:
        files = [(p.stat(), p) for p in folder.rglob(pattern)]
    except OSError:
        return
    total = sum(s.st_size for s, _ in files)
    for s, p in sorted(files, key=lambda sp: sp[0].st_atime if sp[0].st_atime > sp[0].st_mtime else sp[0].st_mtime):
        if total <= max_bytes:
            break
        try:
            p.unlink()
            total -= s.st_size
        except OSError:
            pass


class ByteLRU:
    """A thread-safe LRU map bounded by the sum of the sizes its entries are charged (`budget()` bytes)."""

    def __init__(self, budget: Callable[[], int]):
        self._budget, self._items, self._bytes = budget, OrderedDict(), 0
        self._lock = threading.Lock()

    def get(self, key):
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit[0]
        return None

    def put(self, key, value, size: int) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._items[key] = (value, size)
            self._bytes += size
            budget = self._budget()
            while self._bytes > budget and len(self._items) > 1:
                _, (_, freed) = self._items.popitem(last=False)
                self._bytes -= freed

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)
