"""Where compiled constraints and token tables are cached on disk (atomic writes, pruned to a size), and the
byte-bounded LRU that holds compiled constraints in memory."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Callable


def cache_dir() -> Path:
    """`$SPECSTRUCT_CACHE/constraints`, default `~/.cache/specstruct/constraints`."""
    return Path(os.environ.get("SPECSTRUCT_CACHE", Path.home() / ".cache" / "specstruct")) / "constraints"


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
