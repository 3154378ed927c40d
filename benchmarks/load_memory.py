"""Memory of a loaded engine: what `SpecStruct.from_pretrained` leaves in the process, and its peak while loading.

    python -m benchmarks.load_memory [--model qwen2.5-coder-1.5b] [--draft qwen2.5-coder-0.5b]

Loads the engine in a fresh process (Linux: /proc/self/status, /proc/self/smaps, glibc's mallinfo2) and prints:

- `steps`: the resident set (VmRSS) after each loading step (imports; each model's weights, `load_quantized`; its
  tokenizer; the constraint tables, `prepare`; the engine; the final collect and trim), so each step's share is
  the difference to the one before. The constraint tables are built on a thread while the draft loads, so with a
  draft the two overlap.
- `peak`: the highest VmRSS seen (sampled every 2 ms on a thread) and the step running when it was reached; VmHWM,
  the kernel's own peak, bounds it from above (the sampler can miss a spike shorter than its period).
- `split`: the loaded process as imports, the models' tensors (parameters and buffers as the state dict gives
  them), the GGUF files' pages still resident (file-backed), and the rest (tokenizer, constraint tables, Python
  objects, the kernels' libraries, heap glibc keeps: mallinfo2's free bytes, of which the resident share is at most
  that much).
- `target_file_mib` and `loaded_minus_imports_over_file`: the goal "resident after loading at most the file plus
  15%" checked with and without the imports.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import threading
import time
from pathlib import Path

FIELDS = ("VmRSS", "RssAnon", "RssFile", "VmHWM")


def status_mib() -> dict[str, float]:
    """The FIELDS of /proc/self/status in MiB (empty where there is no /proc)."""
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in FIELDS:
            out[key] = round(int(rest.split()[0]) / 1024, 1)
    return out


def mapped_mib(suffix: str = ".gguf") -> float:
    """MiB resident of file mappings whose path ends with `suffix` (/proc/self/smaps; 0 where there is none)."""
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return 0.0
    total, inside = 0, False
    for line in lines:
        fields = line.split()
        if fields and "-" in fields[0] and not fields[0].endswith(":"):  # a mapping's header line
            inside = len(fields) >= 6 and fields[-1].endswith(suffix)
        elif inside and fields[:1] == ["Rss:"]:
            total += int(fields[1])
    return round(total / 1024, 1)


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def free_heap_mib() -> float | None:
    """MiB of free heap glibc holds in its arenas (mallinfo2's fordblks), or None without glibc 2.33+."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _Mallinfo2
    except (OSError, AttributeError):
        return None
    return round(libc.mallinfo2().fordblks / 2**20, 1)


def tensor_mib(model) -> float:
    """MiB of a model's parameters and buffers as the state dict gives them (packed weights count as plain)."""
    if model is None:
        return 0.0
    return round(sum(t.numel() * t.element_size() for t in model.state_dict().values()
                     if hasattr(t, "numel")) / 2**20, 1)


class Steps:
    """Named loading steps, the resident set after each, and the peak with the step it came in."""

    def __init__(self):
        self.after: list[tuple[str, float]] = []
        self.running: list[str] = []
        self.peak, self.peak_step = 0.0, "between steps"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.is_set():
            rss = status_mib().get("VmRSS", 0.0)
            if rss > self.peak:
                self.peak, self.peak_step = rss, " > ".join(self.running) or "between steps"
            time.sleep(0.002)

    def wrap(self, owner, name: str, label: str) -> None:
        """Record `owner.name(...)` as step `label` (owner: a module or a class)."""
        inner = getattr(owner, name)

        def step(*args, **kwargs):
            self.running.append(label)
            try:
                return inner(*args, **kwargs)
            finally:
                self.running.remove(label)
                self.after.append((label, status_mib().get("VmRSS", 0.0)))

        setattr(owner, name, step)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="target: registry name, folder or .gguf")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b", help="draft model, or '' for none")
    args = ap.parse_args(argv)
    import specstruct as ss

    before = status_mib()
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import specstruct.api.specstruct as api
    import specstruct.engine.core  # noqa: F401
    import specstruct.models.loading as loading
    import specstruct.runtime.gguf_model as gguf_model
    import specstruct.runtime.model_runtime  # noqa: F401
    from specstruct.models.loading import gguf_file, resolve

    imports = status_mib()
    steps = Steps()
    steps.after.append(("imports", imports.get("VmRSS", 0.0)))
    steps.wrap(gguf_model, "load_quantized", "weights")
    steps.wrap(loading, "load_tokenizer", "tokenizer")
    steps.wrap(api, "_prepare", "constraint tables")
    steps.wrap(api.SpecStruct, "__init__", "engine")
    steps.wrap(api, "collect_and_trim", "collect and trim")
    target_file = gguf_file(resolve(args.model))
    steps.start()
    engine = ss.SpecStruct.from_pretrained(args.model, draft=args.draft or None)
    steps.stop()
    loaded = status_mib()
    file_mib = round(target_file.stat().st_size / 2**20, 1) if target_file is not None else None
    tensors = {"target": tensor_mib(engine.model), "draft": tensor_mib(engine.draft_model)}
    split = {"imports": imports.get("VmRSS"), "model_tensors": round(sum(tensors.values()), 1),
             "gguf_file_pages": mapped_mib(".gguf")}
    if loaded and imports:
        split["other"] = round(loaded["VmRSS"] - sum(v or 0.0 for v in split.values()), 1)
    split["free_heap_in_other_at_most"] = free_heap_mib()
    rss = loaded.get("VmRSS")
    report = {"model": args.model, "draft": args.draft or None, "numerics": engine.numerics,
              "before_load_mib": before, "imports_mib": imports, "loaded_mib": loaded,
              "steps_rss_mib": steps.after, "peak_mib": {"rss": steps.peak, "step": steps.peak_step,
                                                         "VmHWM": loaded.get("VmHWM")},
              "split_mib": split, "model_tensors_mib": tensors, "target_file_mib": file_mib,
              "loaded_over_file": round(rss / file_mib, 3) if file_mib and rss else None,
              "loaded_minus_imports_over_file": round((rss - imports["VmRSS"]) / file_mib, 3)
              if file_mib and rss and imports else None}
    print(json.dumps(report, indent=2))
    sys.stdout.flush()
    return report


if __name__ == "__main__":
    main()
