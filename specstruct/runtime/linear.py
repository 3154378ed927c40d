"""Row-invariant Linear layers on CPU: oneDNN's kernel with at least two rows, on weights prepacked into
oneDNN's own layout.

`onednn_linear_forward` replaces `nn.Linear.forward` (runtime.make_row_invariant). `pack_linears` then
replaces each Linear's weight by a `PackedWeight`: the same values reordered once by
`torch.ops.mkldnn._reorder_linear_weight` (same memory; the plain copy is freed), so the kernel no longer
reorders the plain weight on every call. Results are bitwise equal to the plain weight's, and just as
row-invariant (tests/unit/runtime/test_linear.py). Weights shared with another parameter (a LM head tied to
the embeddings) stay plain: the embedding lookup needs the plain layout.

A packed weight is an opaque oneDNN tensor, so what PyTorch does with ordinary weights is provided here:
`copy.deepcopy` keeps it packed, `state_dict()` (and so `torch.save(model.state_dict())`,
`save_pretrained`) and pickling give the plain values, `load_state_dict` / `weight.copy_` repack what they
are given. Other uses of the raw weight (arithmetic, `.half()`, `.to("cuda")`) need `unpack_linears` or
`runtime.restore_stock(model)` first; dtype and device changes say so.
"""

from __future__ import annotations

from typing import Callable, NoReturn, cast

import torch

from specstruct.errors import SpecStructError
from specstruct.runtime.load_memory import file_ranges, page_out
from specstruct.runtime.owned import marks, peek


def onednn_linear_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    # x: [..., in] -> rows [n, in]; y: [n, out] -> [..., out]
    rows = x.reshape(-1, x.shape[-1])
    n = rows.shape[0]
    if n == 1:
        rows = torch.cat([rows, rows])  # oneDNN's 1-row kernel sums differently: keep every row on one path
    bias: torch.Tensor | None = self.bias
    if torch.is_grad_enabled():
        # The kernel has no autograd formula (no gradient ever flowed through it), and with a prepacked weight an
        # input that requires grad changes a small layer's last bits (40x72, measured): keep autograd out of it.
        rows, bias = rows.detach(), None if bias is None else bias.detach()
    y: torch.Tensor = torch.ops.mkldnn._linear_pointwise(rows.contiguous(), self.weight, bias, "none", [], "")
    return y[:n].reshape(*x.shape[:-1], y.shape[-1])


class PackedWeightError(SpecStructError, RuntimeError):
    """An operation that needs a plain weight met a weight prepacked for oneDNN."""


_FIX = "call specstruct.runtime.model_runtime.restore_stock(model) first (it restores plain weights)"


def _reorder(weight: torch.Tensor) -> torch.Tensor:
    packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)
    return packed


class PackedWeight(torch.nn.Parameter):
    """A Linear weight in oneDNN's blocked layout (an opaque mkldnn tensor: `shape`, `dtype`, `numel()`
    work, its storage cannot be read). `to_dense()` gives the plain weight back, bitwise."""

    def __deepcopy__(self, memo: dict[int, object]) -> "PackedWeight":
        if id(self) not in memo:
            memo[id(self)] = PackedWeight(self.data.clone(), self.requires_grad)
        return cast(PackedWeight, memo[id(self)])

    # pickling (torch.save of a whole module) writes the plain weight
    def __reduce_ex__(self, proto: object) -> tuple[type, tuple[torch.Tensor, bool]]:
        return torch.nn.Parameter, (self.to_dense(), False)

    def copy_(self, src: torch.Tensor, non_blocking: bool = False) -> "PackedWeight":
        """New values (load_state_dict calls this), packed again."""
        self.data = _reorder(dense(src).to(torch.float32))
        return self

    def to(self, *args: object, **kwargs: object) -> "PackedWeight":  # refuses moves
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)  # type: ignore[call-overload]
        if (device is None or device.type == "cpu") and dtype in (None, torch.float32):
            return self
        raise PackedWeightError(f"a prepacked Linear weight cannot be moved to {device or dtype}; {_FIX}")

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise PackedWeightError(f"a prepacked Linear weight is float32 on the CPU only; {_FIX}")

    half = bfloat16 = double = cuda = _refuse


def dense(t: torch.Tensor) -> torch.Tensor:
    """A weight's plain values: unpacked if it is packed (for either kernel) or an mkldnn tensor."""
    return t.to_dense() if isinstance(t, PackedWeight) or t.is_mkldnn else t


def dense_state_dict_hook(module: torch.nn.Module, state_dict: dict[str, object], prefix: str,
                          local_metadata: object) -> None:
    """state_dict post-hook of a packed Linear: the plain weight, as a checkpoint expects."""
    key = prefix + "weight"
    if isinstance(module.weight, PackedWeight) and isinstance(state_dict.get(key), torch.Tensor):
        state_dict[key] = module.weight.to_dense()


def shared_weights(model: torch.nn.Module) -> set[int]:
    """ids of parameters registered more than once, or whose storage another parameter also uses."""
    seen: dict[int, int] = {}
    owners: dict[int, set[int]] = {}
    for mod in model.modules():
        for p in mod._parameters.values():
            if p is None or isinstance(p, PackedWeight):
                continue
            seen[id(p)] = seen.get(id(p), 0) + 1
            owners.setdefault(p.untyped_storage().data_ptr(), set()).add(id(p))
    shared = {i for i, count in seen.items() if count > 1}
    for ids in owners.values():
        if len(ids) > 1:
            shared |= ids
    return shared


def pack_weights(model: torch.nn.Module, pack: Callable[[torch.Tensor], torch.Tensor], kind: type, word: str) -> str:
    """Replace every unshared float32 CPU nn.Linear weight by `pack(weight)` (a `kind`, idempotent); a few words
    for the numerics string. Where packing fails, the weights left stay plain (the results are the same)."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    shared, packed, mapped = shared_weights(model), 0, file_ranges()
    for mod in linears:
        w = mod.weight
        if type(w) is kind:
            packed += 1
            continue
        if id(w) in shared or w.dtype != torch.float32 or w.device.type != "cpu" or isinstance(w, PackedWeight):
            continue
        try:
            new = pack(w)
        except Exception as e:  # an op missing from this torch build, or refusing this weight
            return f"{packed} of {len(linears)} weights {word} ({word[:-2]}ing failed: {type(e).__name__})"
        marks(mod).weight_grad = w.requires_grad
        mod.weight = new
        mod.register_state_dict_post_hook(dense_state_dict_hook)  # type: ignore[no-untyped-call]
        if mapped:
            page_out(w, mapped)  # its file pages were read once for packing: give them back now, not at the end
        packed += 1
    return f"{packed} of {len(linears)} weights {word}"


def pack_linears(model: torch.nn.Module) -> str:
    """Prepack every unshared Linear weight for oneDNN (pack_weights)."""
    return pack_weights(model, lambda w: PackedWeight(_reorder(w), requires_grad=False), PackedWeight, "prepacked")


def unpack_linears(model: torch.nn.Module) -> None:
    """Give every packed Linear its plain weight back (a Parameter, bitwise equal to the original)."""
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear) and isinstance(mod.weight, PackedWeight):
            grad = peek(mod).weight_grad
            mod.weight = torch.nn.Parameter(mod.weight.to_dense(), requires_grad=grad)
            for key, hook in list(mod._state_dict_hooks.items()):
                if hook is dense_state_dict_hook:
                    del mod._state_dict_hooks[key]
