"""Where compiled constraints and token tables are cached on disk, and how files get there atomically."""

from __future__ import annotations

import os
from pathlib import Path


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
