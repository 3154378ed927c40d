"""What differs between the decoder layers the runtime computes itself: a small table of per-architecture traits.

Every architecture here is a pre-norm decoder layer with RMSNorm, rotary q/k and a gated MLP; they differ in a few
places, each a trait below: Gemma's norm multiplies by (1 + weight) and wraps attention and MLP in two norms each;
Qwen3 and Gemma 3 norm each q and k head before the rotary embedding; Phi-3 computes q, k, v in one projection and
gate, up in another. The rest comes from the model's own modules: the rotary embedding's cos / sin (Llama 3's
"llama3" scaling, Gemma 3's local and global thetas, Phi-3's partial rotary), the score scale (`attn.scaling`,
Gemma's query_pre_attn_scalar), a layer's sliding window, the embedding scale and the final soft-capping.

`WINDOWED` lists the architectures whose attention modules hand their sliding window and soft-cap to the attention
function (transformers' AttentionInterface) exactly where their masks apply them: the row-wise attention then
computes them (packed.py); another architecture with a window or a cap keeps stock numerics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch

if TYPE_CHECKING:
    from transformers import PretrainedConfig


@dataclass(frozen=True)
class Traits:
    norm_offset: float = 0.0  # Gemma: RMSNorm(x) * (1 + weight), the weight stored less one
    sandwich: bool = False  # Gemma 2 / 3: a norm after attention and after the MLP too (four per layer)
    qk_norm: bool = False  # Qwen3, Gemma 3: RMSNorm over each q and k head before the rotary embedding
    fused_projections: bool = False  # Phi-3: qkv_proj (q, k, v by rows) and gate_up_proj (gate, up)
    activation_key: str = "hidden_act"  # the config field naming the MLP's activation


ARCHITECTURES: dict[str, Traits] = {
    "qwen2": Traits(),
    "llama": Traits(),  # Llama 2 / 3.x, SmolLM
    "mistral": Traits(),
    "qwen3": Traits(qk_norm=True),
    "gemma2": Traits(norm_offset=1.0, sandwich=True, activation_key="hidden_activation"),
    "gemma3_text": Traits(norm_offset=1.0, sandwich=True, qk_norm=True, activation_key="hidden_activation"),
    "phi3": Traits(fused_projections=True),
}
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
WINDOWED = ("qwen2", "qwen3", "mistral", "gemma2", "gemma3_text", "phi3")
# rotary embeddings whose frequencies follow the longest position of a pass: each row by its own (`per_row_rotary`)
PER_ROW_ROPE = ("longrope",)


def config_of(model: torch.nn.Module) -> PretrainedConfig:
    """A transformers model's config, as the type checker should see it."""
    return cast("PretrainedConfig", model.config)


def rope_types(config: PretrainedConfig) -> set[str]:
    """The rope types a config uses (one per layer type where they differ, as Gemma 3's)."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    groups = params.values() if params and all(isinstance(v, dict) or v is None for v in params.values()) else [params]
    return {str((g or {}).get("rope_type", (g or {}).get("type", "default"))) for g in groups}


def rope_support(config: PretrainedConfig) -> tuple[bool, str]:
    """(True, "") where every row's cos / sin depend on its own position alone (after `per_row_rotary`)."""
    other = rope_types(config) - {"default", "linear", "llama3", "yarn", *PER_ROW_ROPE}
    if other:
        return False, f"rope type {sorted(other)[0]!r} scales the rotary embedding by the pass's length"
    return True, ""


def per_row_rotary(model: torch.nn.Module) -> None:
    """For longrope: transformers picks the long or the short frequencies by the largest position in a pass, so a
    row's cos / sin would depend on the other rows packed with it. Here each row gets the set its own position picks
    (the one a one-token step picks): rows below original_max_position_embeddings the short, the rest the long."""
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    config = config_of(model)
    if rotary is None or "forward" in rotary.__dict__ or not rope_types(config) & set(PER_ROW_ROPE):
        return
    params = config.rope_parameters
    limit = params.get("original_max_position_embeddings") or config.original_max_position_embeddings
    stock = type(rotary).forward

    def forward(x: torch.Tensor, position_ids: torch.Tensor, *args: object,
                **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        long = position_ids >= limit
        if not bool(long.any()) or bool(long.all()):
            whole: tuple[torch.Tensor, torch.Tensor] = stock(rotary, x, position_ids, *args, **kwargs)
            return whole
        parts = [stock(rotary, x, position_ids[sel].view(1, -1), *args, **kwargs) for sel in (~long, long)]
        cos = parts[0][0].new_empty((*position_ids.shape, parts[0][0].shape[-1]))
        sin = torch.empty_like(cos)
        for sel, (c, s) in zip((~long, long), parts):
            cos[sel], sin[sel] = c[0], s[0]
        return cos, sin

    rotary.forward = forward


def stock_rotary(model: torch.nn.Module) -> None:
    """Undo `per_row_rotary`."""
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    if rotary is not None:
        rotary.__dict__.pop("forward", None)


def layer_window(attn: torch.nn.Module, config: PretrainedConfig) -> int:
    """The sliding window a layer's attention applies (0: none), as its module hands it to the attention function:
    its own attribute where it has one (None on a full-attention layer), else the config's (Mistral, Phi-3)."""
    window = getattr(attn, "sliding_window") if hasattr(attn, "sliding_window") else getattr(config, "sliding_window",
                                                                                              None)
    return int(window or 0)


def layer_softcap(attn: torch.nn.Module) -> float:
    """The attention-logit soft-cap a layer's attention hands the attention function (0: none): Gemma 2's."""
    return float(getattr(attn, "attn_logit_softcapping", None) or 0.0) if type(attn).__name__.startswith("Gemma2") \
        else 0.0


def norm_eps(norm: torch.nn.Module) -> float | None:
    """An RMSNorm module's epsilon (transformers names it variance_epsilon or eps); None for another module."""
    if not type(norm).__name__.endswith("RMSNorm") or not isinstance(getattr(norm, "weight", None), torch.Tensor):
        return None
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    return float(eps) if eps is not None else None
