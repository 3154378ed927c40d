"""Where KV spans live, each with a byte budget: memory (RAM on CPU, GPU memory on a GPU) and disk (safetensors
files). A tier stores layers it is given and owns them; `get` returns None when they are lost (a spill file that is
missing or fails its checksum): the caller then re-prefills from token ids, which is always correct."""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from specstruct.runtime.kv.layers import KVLayers, nbytes
from specstruct.settings import settings


@dataclass
class Slot:
    nbytes: int
    ref: Any  # the tier's own handle: tensors, a file, pinned tensors and an event


class Tier(Protocol):
    name: str
    budget: int
    used: int

    def put(self, layers: KVLayers) -> Slot: ...

    def get(self, slot: Slot) -> KVLayers | None: ...

    def free(self, slot: Slot) -> None: ...

    def close(self) -> None:
        """Give back what the tier holds outside the process's memory (a spill folder); called once, at the end."""
        ...


class MemoryTier:
    """Tensors kept on `device` (the cache's resident tier)."""

    def __init__(self, budget: int, device: torch.device | str = "cpu", name: str | None = None):
        self.budget, self.used = int(budget), 0
        self.device = torch.device(device)
        self.name = name or ("ram" if self.device.type == "cpu" else str(self.device))

    def put(self, layers: KVLayers) -> Slot:
        layers = [(k.to(self.device), v.to(self.device)) for k, v in layers]
        slot = Slot(nbytes(layers), layers)
        self.used += slot.nbytes
        return slot

    def get(self, slot: Slot) -> KVLayers | None:
        layers: KVLayers | None = slot.ref
        return layers

    def free(self, slot: Slot) -> None:
        self.used -= slot.nbytes
        slot.ref = None

    def close(self) -> None:
        pass


def _digest(layers: KVLayers) -> str:
    h = hashlib.blake2b(digest_size=16)
    for k, v in layers:
        for t in (k, v):
            h.update(t.contiguous().view(torch.uint8).numpy())  # type: ignore[arg-type]  # a buffer, not copied
    return h.hexdigest()


def default_directory() -> Path:
    """`$SPECSTRUCT_CACHE/kv`, default `~/.cache/specstruct/kv`."""
    return settings().cache / "kv"


class DiskTier:
    """One safetensors file per span in a private folder under `directory`, checked by a blake2b digest kept in
    memory (a truncated, corrupted or deleted file reads as lost). The folder is removed by `close()` or at exit."""

    name = "disk"

    def __init__(self, budget: int, directory: str | os.PathLike[str] | None = None):
        self.budget, self.used = int(budget), 0
        self._parent = Path(directory) if directory else default_directory()
        self._dir: Path | None = None
        self._lock = threading.Lock()

    @property
    def directory(self) -> Path:
        with self._lock:
            if self._dir is None:
                self._parent.mkdir(parents=True, exist_ok=True)
                self._dir = Path(tempfile.mkdtemp(prefix=f"spill-{os.getpid()}-", dir=self._parent))
                atexit.register(shutil.rmtree, self._dir, True)  # spill files never outlive the process
            return self._dir

    def put(self, layers: KVLayers) -> Slot:
        from safetensors.torch import save_file

        cpu = [(k.detach().to("cpu").contiguous(), v.detach().to("cpu").contiguous()) for k, v in layers]
        tensors = {f"{kind}{i}": t for i, pair in enumerate(cpu) for kind, t in zip("kv", pair)}
        path = self.directory / f"{uuid.uuid4().hex}.safetensors"
        try:
            save_file(tensors, str(path))
        except BaseException:
            _unlink(path)  # a partial file (a full disk) must not outlive the failed put; the caller sees the error
            raise
        slot = Slot(nbytes(cpu), (path, _digest(cpu), len(cpu)))
        self.used += slot.nbytes
        return slot

    def get(self, slot: Slot) -> KVLayers | None:
        from safetensors.torch import load_file

        path, digest, count = slot.ref
        try:
            tensors = load_file(str(path))
            layers = [(tensors[f"k{i}"], tensors[f"v{i}"]) for i in range(count)]
        except Exception:  # missing, truncated or unreadable: lost, the caller re-prefills
            return None
        return layers if _digest(layers) == digest else None

    def free(self, slot: Slot) -> None:
        self.used -= slot.nbytes
        _unlink(Path(slot.ref[0]))

    def close(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def _unlink(path: Path) -> None:
    """Remove a spill file if it is there. Never raises: freeing must always succeed (the caller's accounting is
    already updated), and a folder deleted or replaced by a file (NotADirectoryError) holds nothing to remove."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass
