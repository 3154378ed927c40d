"""GPU -> pinned host memory: the tier below GPU memory when a GPU is used. Copies run on a side CUDA stream so
the compute stream does not wait; `get` waits for the copy's event, then copies back (also on the side stream)
and makes the current stream wait for it. Untested on the CPU-only development machine (no GPU there)."""

from __future__ import annotations

import torch

from specstruct.runtime.kv.layers import KVLayers, nbytes
from specstruct.runtime.kv.tiers import Slot


class PinnedTier:
    name = "pinned"

    def __init__(self, budget: int, device: torch.device | str = "cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError("the pinned-memory KV tier needs a CUDA GPU; on CPU the tiers are RAM and disk")
        self.budget, self.used = int(budget), 0
        self.device = torch.device(device)
        self._stream = torch.cuda.Stream(device=self.device)  # type: ignore[no-untyped-call]

    def put(self, layers: KVLayers) -> Slot:
        current = torch.cuda.current_stream(self.device)
        self._stream.wait_stream(current)  # the tensors are complete before the copy starts
        host: KVLayers = []
        with torch.cuda.stream(self._stream):
            for k, v in layers:
                pair = []
                for t in (k, v):
                    h = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
                    h.copy_(t, non_blocking=True)
                    if t.is_cuda:
                        t.record_stream(self._stream)  # the allocator keeps the source until the copy is done
                    pair.append(h)
                host.append((pair[0], pair[1]))
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record(self._stream)
        slot = Slot(nbytes(host), (host, done))
        self.used += slot.nbytes
        return slot

    def get(self, slot: Slot) -> KVLayers | None:
        host, done = slot.ref
        done.wait(self._stream)
        out: KVLayers = []
        with torch.cuda.stream(self._stream):
            for k, v in host:
                out.append((k.to(self.device, non_blocking=True), v.to(self.device, non_blocking=True)))
            ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
            ready.record(self._stream)
        current = torch.cuda.current_stream(self.device)
        ready.wait(current)
        for k, v in out:
            k.record_stream(current)  # allocated on the side stream, used on the compute stream
            v.record_stream(current)
        return out

    def free(self, slot: Slot) -> None:
        host, done = slot.ref
        done.synchronize()  # never release pinned memory a copy still reads or writes
        self.used -= slot.nbytes
        slot.ref = None

    def close(self) -> None:
        pass
