"""Memory of a loaded engine: what `SpecStruct.from_pretrained` leaves in the process.

    python -m benchmarks.load_memory [--model qwen2.5-coder-1.5b] [--draft qwen2.5-coder-0.5b]

Loads the engine in a fresh process and prints, from /proc/self/status (Linux), the resident memory split into
anonymous memory (what the machine cannot reclaim) and file pages (a weights file still mapped), the peak while
loading (VmHWM), and the bytes of the models' own tensors for comparison. `imports_mib` is the process after
importing Python's side of it (torch, transformers, the runtime; no model), so `loaded - imports` is what the models,
their tokenizer and the constraint tables hold; `target_file_mib` is the target's GGUF file for comparison.
"""

from __future__ import annotations

import argparse
import json
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


def tensor_mib(model) -> float:
    """MiB of a model's parameters and buffers as the state dict gives them (packed weights count as plain)."""
    if model is None:
        return 0.0
    return round(sum(t.numel() * t.element_size() for t in model.state_dict().values()
                     if hasattr(t, "numel")) / 2**20, 1)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="target: registry name, folder or .gguf")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b", help="draft model, or '' for none")
    args = ap.parse_args(argv)
    import specstruct as ss

    before = status_mib()
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import specstruct.engine.core  # noqa: F401
    import specstruct.runtime.gguf_model  # noqa: F401
    import specstruct.runtime.model_runtime  # noqa: F401
    from specstruct.models.loading import gguf_file, resolve

    imports = status_mib()
    target_file = gguf_file(resolve(args.model))
    engine = ss.SpecStruct.from_pretrained(args.model, draft=args.draft or None)
    loaded = status_mib()
    file_mib = round(target_file.stat().st_size / 2**20, 1) if target_file is not None else None
    report = {"model": args.model, "draft": args.draft or None, "numerics": engine.numerics,
              "before_load_mib": before, "imports_mib": imports, "loaded_mib": loaded, "target_file_mib": file_mib,
              "loaded_minus_imports_over_file": round((loaded["VmRSS"] - imports["VmRSS"]) / file_mib, 3)
              if file_mib and loaded and imports else None,
              "model_tensors_mib": {"target": tensor_mib(engine.model), "draft": tensor_mib(engine.draft_model)}}
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
