"""Row-invariant Linear layers on CPU with specstruct's own fixed-order kernel (csrc/fixed_linear.cpp).

oneDNN (linear.py) is row-invariant only from two rows up, so a lone row pays for a padding copy, and its
small-batch kernel is slower than MKL's one-row GEMV: the one-token step cost ~1.3x stock transformers'
(docs/benchmarks.md). This kernel sums every output in an order fixed by the input size alone, so one row is
computed as it would be among any others with no padding, and it streams the weights once per call like a
GEMV, so 1-9 rows cost about what one does.

It is C++ built once per machine (native.py: torch.utils.cpp_extension, a C++ compiler and ninja; -march=native,
so the build is keyed by the CPU's flags) into torch's extension cache. Where it cannot be built, or with
SPECSTRUCT_LINEAR=onednn, the runtime uses oneDNN instead (`kernel()` says why); the numerics string names the
kernel in use. A model's Linear weights are packed once into the kernel's panels ([P, K, NB]: NB output
columns per panel, zero-padded), replacing the plain ones (`PanelWeight`, which keeps the plain shape and
everything linear.PackedWeight provides: deepcopy, state_dict, load_state_dict, restore_stock). The same
kernel on int8 panels runs the draft model (draft_int8.py), and on float16 / bfloat16 panels a GGUF file's F16 /
BF16 weights as they ship (half_linear.py): each weight widened exactly as it is loaded, so the result is the
float32 kernel's on the widened weights, bit for bit, at half the bytes.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator, Protocol, cast, get_args

import torch

from specstruct.runtime import native
from specstruct.runtime.linear import PackedWeight, dense, onednn_linear_forward, pack_weights
from specstruct.runtime.load_memory import empty_on_huge_pages
from specstruct.settings import LinearKernel, overridden, settings

KERNELS: tuple[str, ...] = get_args(LinearKernel)
_KERNEL = native.Kernel("specstruct_fixed_linear", Path(__file__).parent / "csrc" / "fixed_linear.cpp",
                        "the fixed-order Linear kernel", "using oneDNN's linear instead")
_RUNNING: FixedLinearOps | None = None  # another build of the kernel, inside `running`


def requested_kernel() -> str:
    """Setting SPECSTRUCT_LINEAR: "fixed" (default) or "onednn"."""
    return settings().linear


@contextlib.contextmanager
def using(name: str) -> Iterator[None]:
    """Kernel `name` ("fixed" or "onednn") for the models packed inside the block (benchmarks comparing kernels),
    whatever SPECSTRUCT_LINEAR says, then as before; the environment is left as it is."""
    with overridden(linear=name):
        yield


class FixedLinearOps(Protocol):
    """What csrc/fixed_linear.cpp's extension provides."""

    panel_width: int
    simd: str

    def linear(self, x: torch.Tensor, panels: torch.Tensor, out_features: int,
               bias: torch.Tensor | None) -> torch.Tensor: ...

    def linear_int8(self, x: torch.Tensor, panels: torch.Tensor, out_features: int, scale: torch.Tensor,
                    bias: torch.Tensor | None) -> torch.Tensor: ...


def kernel() -> FixedLinearOps | None:
    """The built extension, or None (then `why_not()` says why). Built on first use, then loaded from cache."""
    if requested_kernel() == "onednn":
        return None
    return built() if _KERNEL.load() is not None else None


def built() -> FixedLinearOps:
    """The extension if this process built it (what packed weights were made for), whatever SPECSTRUCT_LINEAR
    says now."""
    return cast(FixedLinearOps, _RUNNING or _KERNEL.module)


@contextlib.contextmanager
def running(ext: FixedLinearOps) -> Iterator[None]:
    """Packed weights computed by another build of this kernel inside the block (bench/kernel_ab compares two
    versions of the source on the same panels; both must pack the same panel width), then by this one again."""
    global _RUNNING
    ours, before = built(), _RUNNING
    if ext.panel_width != ours.panel_width:
        raise ValueError(f"the other kernel packs {ext.panel_width}-column panels, this one {ours.panel_width}")
    _RUNNING = ext
    try:
        yield
    finally:
        _RUNNING = before


def kernel_for(march: str) -> FixedLinearOps:
    """This kernel's source built for another instruction set (native.Kernel.for_march)."""
    return cast(FixedLinearOps, _KERNEL.for_march(march))


def why_not() -> str | None:
    """Why `kernel()` is None: the environment asked for oneDNN, or the build failed."""
    if requested_kernel() == "onednn":
        return "SPECSTRUCT_LINEAR=onednn"
    return _KERNEL.error


class PanelWeight(PackedWeight):
    """A Linear weight packed into the fixed-order kernel's panels. `shape` and `size()` are the plain weight's
    (what code reading a Linear's shape expects); `.data` is the [P, K, NB] panel tensor; `to_dense()` gives
    the plain weight back, bitwise."""

    @staticmethod
    def pack(weight: torch.Tensor) -> "PanelWeight":
        out = PanelWeight(pack_weight(weight.to(torch.float32)), requires_grad=False)
        out.out_features = weight.shape[0]
        return out

    out_features: int

    @property  # the plain weight's shape, read-only
    def shape(self) -> torch.Size:  # type: ignore[override]
        return torch.Size((self.out_features, self.data.shape[1]))

    def size(self, dim: int | None = None) -> torch.Size | int:  # type: ignore[override]
        return self.shape if dim is None else self.shape[dim]

    def to_dense(self, dtype: torch.dtype | None = None, *, masked_grad: bool | None = None) -> torch.Tensor:
        p, k, nb = self.data.shape
        return self.data.permute(0, 2, 1).reshape(p * nb, k)[: self.out_features].contiguous()

    def __deepcopy__(self, memo: dict[int, object]) -> "PanelWeight":
        if id(self) not in memo:
            memo[id(self)] = PanelWeight.pack(self.to_dense())
        return cast(PanelWeight, memo[id(self)])

    def copy_(self, src: torch.Tensor, non_blocking: bool = False) -> "PanelWeight":
        plain = dense(src)
        self.data = pack_weight(plain.to(torch.float32))
        self.out_features = plain.shape[0]
        return self


KEPT = (torch.float32, torch.int8, torch.float16, torch.bfloat16)  # what the kernel reads as it is
_CHUNK_PANELS = 64  # panels filled at a time: a conversion of a big weight never holds a whole float copy


def pack_weight(weight: torch.Tensor, width: int | None = None) -> torch.Tensor:
    """[N, K] -> [P, K, NB] panels (columns past N are zeros) on huge pages where the OS gives them, in the
    weight's own dtype where the kernel reads it (float32, int8, float16, bfloat16), else float32. Filled a few
    panels at a time from `weight` (which may be a view of a mapped file). `width`: NB, default this build's."""
    nb = width or built().panel_width
    w = weight.detach()
    dtype = w.dtype if w.dtype in KEPT else torch.float32
    n, k = w.shape
    panels = -(-n // nb)
    out = empty_on_huge_pages((panels, k, nb), dtype)
    for p0 in range(0, panels, _CHUNK_PANELS):
        p1 = min(panels, p0 + _CHUNK_PANELS)
        rows = w[p0 * nb : p1 * nb].to(dtype)
        if rows.shape[0] != (p1 - p0) * nb:  # the last panel's missing columns
            rows = torch.cat([rows, rows.new_zeros((p1 - p0) * nb - rows.shape[0], k)])
        out[p0:p1].copy_(rows.reshape(p1 - p0, nb, k).transpose(1, 2))
    return out


def fixed_linear_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    # x: [..., in] -> rows [n, in]; y: [n, out] -> [..., out]
    weight, bias = self.weight, self.bias
    if not isinstance(weight, PanelWeight):  # a weight shared with another parameter (tied embeddings) stays plain
        return onednn_linear_forward(self, x)
    rows = x.reshape(-1, x.shape[-1])
    bias_rows: torch.Tensor | None = bias
    if torch.is_grad_enabled():  # the kernel has no autograd formula: no gradient ever flows through it
        rows, bias_rows = rows.detach(), None if bias is None else bias.detach()
    y = built().linear(rows, weight.data, weight.out_features, bias_rows)  # built: the weight was packed for it
    return y.reshape(*x.shape[:-1], y.shape[-1])


def pack_panels(model: torch.nn.Module) -> str:
    """Pack every unshared Linear weight into panels (linear.pack_weights). A shared weight (an LM head tied to
    the embeddings) stays plain: oneDNN computes that layer."""
    return pack_weights(model, PanelWeight.pack, PanelWeight, "packed")
