"""A causal LM and its KV cache: prefill, extend by k tokens, crop.

On CPU in float32 the model is switched to *row-invariant* numerics, which is what makes speculative
decoding both fast and lossless there:

- Linear layers run through oneDNN (`torch.ops.mkldnn._linear_pointwise`) with at least two rows. oneDNN's
  1-row path sums in another order, so a lone row is padded with a copy of itself. Measured on the 2-core
  AVX2 machines: every row's result is bitwise identical whether it is computed alone or among 2..300 rows,
  while stock `F.linear` and `(W @ x.T).T` change a row's last bits with the batch size. Verifying 8 tokens
  costs about 1.5x one token instead of 2.6x (see docs/benchmarks.md).
- Attention for short query blocks (decoding, verification) is computed row by row over exactly the keys each
  row may see, so a token's logits never depend on which other tokens share the pass.

Together these make greedy speculative output token-for-token equal to greedy one-token-at-a-time decoding.
Prefill runs in chunks of at most ROWWISE_MAX_ROWS tokens, so it takes the same row-wise path and a prompt's
result does not depend on where a cached prefix ended (decoding/kv/prefill.py).
"""

from __future__ import annotations

import inspect
import types
from typing import Sequence

import torch
import torch.nn.functional as F

from .kv.prefill import cached_prefill

ROWWISE_MAX_ROWS = 32  # query blocks up to this size use exact row-by-row attention
STOCK_PREFILL_CHUNK = 256  # prefill chunk under stock numerics (GPU, bf16): cached prefixes reuse whole chunks
_ATTN_NAME = "specstruct_rowwise"


def _onednn_linear_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    # x: [..., in] -> rows [n, in]; y: [n, out] -> [..., out]
    rows = x.reshape(-1, x.shape[-1])
    n = rows.shape[0]
    if n == 1:
        rows = torch.cat([rows, rows])  # oneDNN's 1-row kernel sums differently: keep every row on one path
    y = torch.ops.mkldnn._linear_pointwise(rows.contiguous(), self.weight, self.bias, "none", [], "")
    return y[:n].reshape(*x.shape[:-1], y.shape[-1])


def _rowwise_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """query [1, H, Lq, D], key/value [1, Hkv, Lk, D] (cache included) -> ([1, Lq, H, D], None)."""
    b, h, lq, d = query.shape
    hkv, lk = key.shape[1], key.shape[2]
    scaling = scaling if scaling is not None else d**-0.5
    if b != 1 or lq > ROWWISE_MAX_ROWS:
        # Long blocks (prefill): stock SDPA with an explicit causal mask aligned to the cache end.
        causal = torch.ones(lq, lk, dtype=torch.bool, device=query.device).tril(lk - lq)
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=causal, scale=scaling, enable_gqa=(h != hkv)
        )
        return out.transpose(1, 2).contiguous(), None
    g = h // hkv
    q = query[0].reshape(hkv, g, lq, d)  # [Hkv, g, Lq, D]
    k, v = key[0], value[0]  # [Hkv, Lk, D]
    rows = []
    for i in range(lq):
        seen = lk - lq + i + 1  # keys visible to row i
        s = torch.matmul(q[:, :, i, :], k[:, :seen, :].transpose(1, 2)) * scaling  # [Hkv, g, seen]
        p = torch.softmax(s, dim=-1, dtype=torch.float32).to(v.dtype)
        rows.append(torch.matmul(p, v[:, :seen, :]))  # [Hkv, g, D]
    out = torch.stack(rows, dim=2).reshape(h, lq, d)  # [H, Lq, D]
    return out.transpose(0, 1).unsqueeze(0).contiguous(), None  # [1, Lq, H, D]


def _register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(_ATTN_NAME, _rowwise_attention)


def row_invariant_available(model: torch.nn.Module) -> bool:
    p = next(model.parameters())
    return p.device.type == "cpu" and p.dtype == torch.float32 and torch.backends.mkldnn.is_available()


def make_row_invariant(model: torch.nn.Module) -> str:
    """Switch a CPU float32 model to row-invariant numerics in place (idempotent). Returns a description."""
    if getattr(model, "_specstruct_numerics", None):
        return model._specstruct_numerics
    if not row_invariant_available(model):
        desc = f"stock ({next(model.parameters()).dtype}, {next(model.parameters()).device.type})"
        model._specstruct_numerics = desc
        return desc
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear):
            mod.forward = types.MethodType(_onednn_linear_forward, mod)
    _register_attention()
    model.config._attn_implementation = _ATTN_NAME
    for sub in model.modules():  # submodules keep their own config reference in some architectures
        cfg = getattr(sub, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            cfg._attn_implementation = _ATTN_NAME
    model._specstruct_numerics = "float32, row-invariant (oneDNN linear >=2 rows, row-wise attention)"
    return model._specstruct_numerics


def restore_stock(model: torch.nn.Module) -> None:
    """Undo make_row_invariant (for baselines that must run the stock transformers numerics)."""
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear) and "forward" in mod.__dict__:
            del mod.forward
    for sub in model.modules():
        cfg = getattr(sub, "config", None)
        if getattr(cfg, "_attn_implementation", None) == _ATTN_NAME:
            cfg._attn_implementation = "sdpa"
    model.__dict__.pop("_specstruct_numerics", None)


def quantize_draft(model: torch.nn.Module) -> torch.nn.Module:
    """A dynamic-int8 copy of a CPU draft model (torch.ao, Linear layers): about 3x cheaper per step here.

    Safe for losslessness because the target verifies every token: the draft's numerics only change how often
    its proposals are accepted, never what is output. (Not for targets: its per-tensor activation scale makes a
    row's result depend on its neighbours.)"""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's deprecation notice; the kernel itself is current
        q = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    q._specstruct_draft_numerics = "int8 dynamic (torch.ao), draft only"
    return q


def output_rows(model: torch.nn.Module) -> int:
    """Logits per token (the LM head's rows; quantized heads expose `weight` as a method)."""
    weight = model.get_output_embeddings().weight
    return int((weight() if callable(weight) else weight).shape[0])


class ModelRuntime:
    """One sequence (batch size 1) of a transformers causal LM with an explicit DynamicCache."""

    def __init__(self, model: torch.nn.Module, *, row_invariant: bool = True):
        from transformers import DynamicCache

        self.model = model.eval()
        self._cache_cls = DynamicCache
        self.numerics = make_row_invariant(model) if row_invariant else "stock"
        self.device = next(model.parameters()).device
        self.vocab_size = output_rows(model)
        self.max_length = int(getattr(model.config, "max_position_embeddings", 0) or 0) or None
        self.cache = None
        self._length = 0
        # kv/ prefix cache hook: prefill in chunks cut at multiples of prefill_chunk (row-wise attention), so a cached
        # prefix of any length reproduces a cold prefill bitwise; not row-invariant (int8 draft): whole chunks only
        self.prefix_cache, self.cache_key, self.cached_tokens = None, (id(model), self.numerics), 0
        self.prefill_chunk = ROWWISE_MAX_ROWS if "row-invariant" in self.numerics else STOCK_PREFILL_CHUNK
        quantized = any(type(m).__module__.startswith("torch.ao.nn.quantized") for m in model.modules())
        self.prefill_align = 1 if "row-invariant" in self.numerics and not quantized else self.prefill_chunk
        # transformers >= 5.2x names the argument `cache`; older releases `past_key_values`.
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._last_only = {"logits_to_keep": 1} if "logits_to_keep" in params else {}

    @property
    def length(self) -> int:
        return self._length

    def prefill(self, ids: Sequence[int], *, cache_salt: str | None = None, reuse: bool = True) -> torch.Tensor:
        """Start a new sequence, reusing the longest cached prefix of `ids` (see decoding/kv/prefill.py); returns
        the logits after the last prompt token, shape [vocab]. `cached_tokens` says how many came from the cache."""
        cache = self.prefix_cache if reuse else None
        logits, self.cached_tokens = cached_prefill(self, ids, cache=cache, namespace=(self.cache_key, cache_salt),
                                                    chunk=self.prefill_chunk, align=self.prefill_align)
        return logits

    def start(self, layers: list, length: int) -> None:
        """Begin a sequence holding `layers` ([(key, value)] per layer, `length` positions; copied, not shared)."""
        self.cache = self._cache_cls(ddp_cache_data=layers or None, config=self.model.config)
        self._length = length

    def kv_layers(self) -> list:
        """The cache's (key, value) per layer: read-only views, for the prefix cache to copy from."""
        return [(layer.keys, layer.values) for layer in self.cache.layers]

    @torch.inference_mode()
    def extend(self, ids: Sequence[int], *, last_only: bool = False) -> torch.Tensor:
        """Append tokens; returns their logits, shape [len(ids), vocab] (float32); [1, vocab] with `last_only`."""
        if self.cache is None:
            raise RuntimeError("call prefill() before extend()")
        n = len(ids)
        input_ids = torch.tensor([list(ids)], dtype=torch.long, device=self.device)  # [1, n]
        positions = torch.arange(self._length, self._length + n, device=self.device).unsqueeze(0)  # [1, n]
        cache_kw = {self._cache_arg: self.cache, **(self._last_only if last_only else {})}
        out = self.model(input_ids=input_ids, position_ids=positions, use_cache=True, **cache_kw)
        self._length += n
        return out.logits[0].float()  # [n, vocab]

    def crop(self, length: int) -> None:
        """Forget cached positions from `length` on."""
        remove = self._length - length
        if remove < 0:
            raise ValueError(f"cannot crop to {length}: only {self._length} positions are cached")
        if remove:
            self.cache.crop(-remove)  # a negative count removes from the end (transformers 4.x and 5.x)
            self._length = length
