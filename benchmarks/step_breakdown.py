"""Where one decode step of specstruct's runtime goes: its parts timed by wrapping them, in one process.

    python -m benchmarks.step_breakdown [--model qwen2.5-coder-0.5b] [--weights auto|float32] [--cache 300]

Runs `--repeats` one-token steps on a `--cache`-token context and reports the median step and, per step, the time
inside the Linear layers (the LM head apart), the attention function (its KV cache update apart) and the RMSNorm
layers (with the fused layer: its norms and rotary embedding); the rest is the model's other small ops (rotary, activation, residuals) and Python. `--draft` times the
model as the engine runs a draft (weight-only int8). The wrappers add a few microseconds per call, so the parts are
slightly high and the rest slightly low.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import statistics
import time

import torch
from specstruct.testing import OneSequence


@contextlib.contextmanager
def _timed(totals: collections.Counter, key: str, obj, name: str):
    """Add the time spent in `obj.name` (a module's forward, or a class's function) to totals[key]; restored after."""
    original, own = getattr(obj, name), obj.__dict__.get(name)  # own: an instance's forward replaced (the kernels)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            totals[key] += time.perf_counter() - t0

    setattr(obj, name, wrapper)
    try:
        yield
    finally:
        if own is not None:
            setattr(obj, name, own)
        else:
            delattr(obj, name)  # the class's own again


def breakdown(model, cache: int, repeats: int, head_tokens: int = 0) -> dict[str, float]:
    """Median step and per-step milliseconds of each part (see the module docstring); `head_tokens` > 0: the LM head
    computes the first head_tokens token ids only (draft_head.restricted, as EngineConfig.draft_head_tokens)."""
    from transformers import DynamicCache

    from specstruct.runtime import fused_layer, packed
    from specstruct.runtime.quantized import QuantLinear, QuantWeight

    rt = OneSequence(model)
    model = rt.runtime.model  # the runtime computes on its own copy of the model: time that one's modules
    vocab = rt.vocab_size
    rt.prefill([(100 + i) % vocab for i in range(cache)])
    head = model.get_output_embeddings()
    totals: collections.Counter = collections.Counter()
    with contextlib.ExitStack() as stack:
        if head_tokens:
            from specstruct.runtime.draft_head import HeadRestricted, restricted

            HeadRestricted(rt.runtime, head_tokens)  # the engine's checks: a block-quantized head, 0 < N < its rows
            stack.enter_context(restricted(head, head_tokens))  # first: the head's timer below wraps it
        for m in model.modules():
            linear = hasattr(m, "in_features") and hasattr(m, "out_features") and not isinstance(m, QuantLinear)
            kind = ("lm head" if m is head else "linear layers" if linear
                    else "rmsnorm" if type(m).__name__.endswith("RMSNorm") else None)
            if kind:
                stack.enter_context(_timed(totals, kind, m, "forward"))
        # block-quantized weights: every product (merged projections included) is one QuantWeight.linear call
        stack.enter_context(_timed(totals, "linear layers", QuantWeight, "linear"))
        ops = fused_layer._KERNEL.module
        for name in ("rms_norm", "add_rms_norm", "rope_") if ops is not None else ():
            stack.enter_context(_timed(totals, "rmsnorm", ops, name))  # the fused layer's norms (and its rotary)
        stack.enter_context(_timed(totals, "kv cache update", DynamicCache, "update"))
        stack.enter_context(_timed(totals, "attention", packed, "attend_pass"))
        steps = []
        for r in range(repeats + 2):  # two warm-up steps
            if r == 2:
                totals.clear()
            t0 = time.perf_counter()
            rt.extend([500 % vocab])
            steps.append(time.perf_counter() - t0)
            rt.crop(cache)
    out = {"step": statistics.median(steps[2:]) * 1e3}
    parts = {k: v / repeats * 1e3 for k, v in totals.items()}
    parts["attention"] = parts.get("attention", 0.0) - parts.get("kv cache update", 0.0)
    if isinstance(head, QuantLinear) and not head_tokens:  # its QuantWeight.linear call is inside its wrapper too
        parts["linear layers"] = parts.get("linear layers", 0.0) - parts.get("lm head", 0.0)
    out.update(parts)
    out["other small ops and Python"] = statistics.mean(steps[2:]) * 1e3 - sum(parts.values())
    return out


def main(argv: list[str] | None = None) -> None:
    from specstruct.runtime.gguf_model import WEIGHTS, load_model
    from specstruct.runtime.model_runtime import quantize_draft

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--weights", default="auto", choices=WEIGHTS,
                    help="as SpecStruct.from_pretrained: auto keeps a GGUF file's blocks; float32 de-quantizes")
    ap.add_argument("--draft", action="store_true", help="float32 weights: time the model as a draft (int8)")
    ap.add_argument("--cache", type=int, default=300, help="tokens already in the cache")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--head-tokens", type=int, default=0,
                    help="the LM head over the first N token ids only, as a draft with EngineConfig.draft_head_tokens")
    args = ap.parse_args(argv)
    model, _ = load_model(args.model, weights=args.weights)
    if args.draft and args.weights == "float32":
        model = quantize_draft(model)
    parts = breakdown(model, args.cache, args.repeats, args.head_tokens)
    head = f", LM head over the first {args.head_tokens} token ids" if args.head_tokens else ""
    print(f"{args.model}{' (int8 draft)' if args.draft else ''}{head}, {torch.get_num_threads()} threads, {args.cache}-token "
          f"cache: one step {parts.pop('step'):.1f} ms (median of {args.repeats}); per step:")
    for name, ms in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"  {name:28s} {ms:6.1f} ms")


if __name__ == "__main__":
    main()
