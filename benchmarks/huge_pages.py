"""The block-quantized weights on transparent huge pages against the same weights on 4 KiB pages, in one process.

    python -m benchmarks.huge_pages [--model qwen2.5-coder-1.5b] [--ks 1,5] [--cache 200] [--rounds 6]

QuantWeight puts its tensors on huge pages where the OS allows (load_memory.empty_on_huge_pages: Linux with
transparent huge pages in "madvise" or "always" mode). This loads the model as `from_pretrained` does, copies every
QuantWeight's tensors onto ordinary pages (MADV_NOHUGEPAGE), and times passes of k new tokens on a cached prefix
(step_cost's) with one set and then the other, alternating for `--rounds` rounds: the median of each, and the median
of the rounds' ratios (4 KiB / huge). The outputs of both must be the same bits (the same weights). Prints how much
of the process sits on huge pages (AnonHugePages) before the copies.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import statistics
import warnings
from pathlib import Path

import torch

from benchmarks.step_cost import measure
from specstruct.runtime.load_memory import _libc
from specstruct.runtime.owned import hand_over
from specstruct.runtime.quantized import QuantWeight
from specstruct.testing import OneSequence

_MADV_NOHUGEPAGE = 15
PARTS = ("packed", "scales", "mins", "subscales", "submins")


def huge_kib() -> int:
    """AnonHugePages of this process, KiB (0 where the kernel does not report it)."""
    path = Path("/proc/self/smaps_rollup")
    for line in path.read_text().splitlines() if path.exists() else []:
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


def on_small_pages(t: torch.Tensor, copies: dict[int, torch.Tensor], libc: ctypes.CDLL | None) -> torch.Tensor:
    """`t` over a copy of its whole storage advised against huge pages before anything touches it; `copies` keeps
    one copy per storage, so the views of a merged weight (its parts' QuantWeights) share it as they share the
    original."""
    storage = t.untyped_storage()
    key = storage.data_ptr()
    if key not in copies:
        whole = torch.empty(0, dtype=t.dtype).set_(storage)
        out = torch.empty(whole.shape, dtype=t.dtype)
        page = 4096
        ptr, size = out.data_ptr(), out.numel() * out.element_size()
        start, end = ptr // page * page, -(-(ptr + size) // page) * page
        if libc is None or libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), _MADV_NOHUGEPAGE):
            raise SystemExit("madvise(MADV_NOHUGEPAGE) failed: this OS has no transparent huge pages to compare")
        copies[key] = out.copy_(whole)
    return copies[key].as_strided(t.shape, t.stride(), t.storage_offset())


def block_weights() -> list[QuantWeight]:
    """Every QuantWeight alive in this process."""
    gc.collect()
    with warnings.catch_warnings():  # gc.get_objects touches torch's deprecated module attributes
        warnings.simplefilter("ignore")
        return [o for o in gc.get_objects() if isinstance(o, QuantWeight)]


def compare(rt: OneSequence, ks: list[int], cache: int, repeats: int, rounds: int) -> tuple[bool, dict]:
    """(the same logits on both page sizes, {pass: (huge-page ms, 4 KiB ms, median of the rounds' ratios)})."""
    weights = block_weights()
    if not weights:
        raise SystemExit("the model has no block-quantized weights to move")
    huge = [{n: getattr(w, n) for n in PARTS} for w in weights]
    copies: dict[int, torch.Tensor] = {}
    libc = _libc()
    small = [{n: None if t is None else on_small_pages(t, copies, libc) for n, t in parts.items()} for parts in huge]

    def use(sets: list[dict]) -> None:
        for w, parts in zip(weights, sets):
            for n, t in parts.items():
                setattr(w, n, t)

    vocab = rt.vocab_size
    logits = []
    for sets in (huge, small):
        use(sets)
        probe = rt.sequence()
        logits.append(rt.forward([(probe, [i % vocab for i in range(1000, 1000 + cache)])], [1])[0])
    times: dict[str, dict[str, list[float]]] = {"huge": {}, "small": {}}
    for r in range(rounds):
        order = [("huge", huge), ("small", small)]
        for name, sets in order if r % 2 == 0 else order[::-1]:
            use(sets)
            for key, ms in measure(rt, ks, cache, 0, repeats).items():
                times[name].setdefault(key, []).append(ms)
    use(huge)
    rows = {key: (statistics.median(a), statistics.median(times["small"][key]),
                  statistics.median(y / x for x, y in zip(a, times["small"][key])))
            for key, a in times["huge"].items()}
    return torch.equal(logits[0], logits[1]), rows


def main(argv: list[str] | None = None) -> None:
    from specstruct.runtime.gguf_model import load_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--ks", default="1,5", help="new tokens per pass, comma-separated")
    ap.add_argument("--cache", type=int, default=200, help="tokens already cached")
    ap.add_argument("--repeats", type=int, default=9, help="passes per k and round")
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args(argv)
    model, _ = load_model(args.model, weights="auto")
    hand_over(model)  # switched in place, as from_pretrained's: the merged projections replace their parts
    rt = OneSequence(model)
    del model
    held = huge_kib()
    same, rows = compare(rt, [int(k) for k in args.ks.split(",")], args.cache, args.repeats, args.rounds)
    print(f"{args.model}, {torch.get_num_threads()} threads; AnonHugePages after loading {held / 1024:.0f} MiB; "
          f"median of {args.rounds} alternating rounds")
    print(f"the same logits either way: {same}")
    print(f"{'pass':24s}{'huge pages, ms':>16s}{'4 KiB pages, ms':>17s}{'4 KiB / huge':>14s}")
    for key, (a, b, ratio) in rows.items():
        print(f"{key:24s}{a:16.1f}{b:17.1f}{ratio:13.2f}x")


if __name__ == "__main__":
    main()
