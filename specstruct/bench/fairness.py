"""Making sure a comparison compares like with like: same weights, and known numerics on every side.

A speedup is only meaningful when both sides run the same weights. Numerics matter too: specstruct's
runtime may compute Linear layers with a row-invariant kernel, while a baseline calling the stock
modules gets PyTorch's default kernel; that changes timings (and can flip a near-tie argmax), so every
side's numerics are described in the results.
"""

from __future__ import annotations

import hashlib
from typing import Any

from specstruct.errors import SpecStructError


class ComparisonError(SpecStructError, ValueError):
    """Two sides of a benchmark comparison use different weights or numerics, so their speeds and
    outputs cannot be compared."""


def weights_fingerprint(model: Any, tensors: int = 4, samples: int = 4096) -> str:
    """A short hash of a few weight tensors (first, evenly spaced middle ones, last): name, shape, dtype
    and an evenly strided sample of values. Cheap on a 1.5B model, and different for different
    checkpoints or a perturbed copy of the same one."""
    from specstruct.runtime.linear import dense  # torch, only when a model is fingerprinted

    params = list(model.named_parameters())
    params += [(n, b) for n, b in model.named_buffers() if n.endswith(".packed")]  # quantized weights (runtime/quantized)
    if not params:
        raise ComparisonError(f"{type(model).__name__} has no parameters to fingerprint; pass a torch model.")
    picks = sorted({round(i * (len(params) - 1) / max(tensors - 1, 1)) for i in range(tensors)})
    digest = hashlib.sha256()
    for index in picks:
        name, tensor = params[index]
        flat = dense(tensor).detach().reshape(-1)  # a packed weight's plain values
        sample = flat[:: max(1, flat.numel() // samples)].float().cpu().contiguous()
        digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}|".encode())
        digest.update(sample.numpy().tobytes())
    return digest.hexdigest()[:16]


def linear_numerics(model: Any) -> str:
    """Describe how `model`'s Linear layers compute right now: stock `torch.nn.Linear`, or patched
    (a subclass, an instance-level forward, or forward hooks), plus the weight dtype and the attention
    implementation transformers will call."""
    import torch

    stock, patched, kinds = 0, 0, set()
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        custom = (type(module) is not torch.nn.Linear or "forward" in module.__dict__
                  or bool(module._forward_hooks) or bool(module._forward_pre_hooks))
        if custom:
            patched += 1
            kinds.add(type(module).__name__ if type(module) is not torch.nn.Linear else "patched forward")
        else:
            stock += 1
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    attention = getattr(getattr(model, "config", None), "_attn_implementation", None) or "default"
    if patched == 0:
        return f"stock torch.nn.Linear ({dtype}), attention: {attention}"
    return (f"{patched} of {stock + patched} Linear layers patched ({', '.join(sorted(kinds))}; {dtype}), "
            f"attention: {attention}")


def engine_numerics(engine: Any) -> str:
    """The numerics a specstruct engine reports (`engine.numerics`), else what its model's layers show."""
    described = getattr(engine, "numerics", None)
    if described:
        return str(described)
    return f"unknown (engine does not report numerics; model Linear layers: {linear_numerics(engine.model)})"


def require_same(sides: dict[str, dict[str, str]], *, numerics_must_match: tuple[str, ...] = ()) -> None:
    """Refuse a comparison whose sides use different weights, or (for the named sides) different numerics.

    `sides` maps a side name to {"weights": fingerprint, "numerics": description}."""
    fingerprints = {name: info["weights"] for name, info in sides.items()}
    if len(set(fingerprints.values())) > 1:
        detail = ", ".join(f"{name}={fp}" for name, fp in fingerprints.items())
        raise ComparisonError(
            f"benchmark sides use different weights ({detail}); a speedup between different models means "
            "nothing. Build every side from the same target model object (e.g. one engine, with "
            "speculation switched off per call for the target-only side)."
        )
    described = {name: sides[name]["numerics"] for name in numerics_must_match if name in sides}
    if len(set(described.values())) > 1:
        detail = "; ".join(f"{name}: {desc}" for name, desc in described.items())
        raise ComparisonError(
            f"specstruct sides use different numerics ({detail}): greedy outputs and timings would differ "
            "for reasons other than speculation. Run both sides with the same runtime settings."
        )
