"""A draft model whose LM head computes only the most frequent token ids (FR-Spec, Zhao et al. 2025).

On a CPU a draft step streams the draft's weights once, and the LM head is a large share of them: on the shipped
0.5B draft (Q8_0 head, 151,936 x 896) about 145 MB of the ~390 MB a step reads. A byte-level BPE vocabulary is
numbered in merge order, so its low ids are its frequent tokens: the first 32,768 ids held 89% of the target's
tokens on the bench's prose prompts, and the draft's greedy choice over only them agreed with the target's next
token 60.0% of the time against 62.5% over the whole vocabulary (teacher-forced, 120 tokens).

`HeadRestricted` wraps the draft's runtime: during its passes only the head's first panels are computed (the
block-quantized kernel's `linear_panels`, bitwise what the whole head gives for those tokens), every other logit is
-inf. The draft then never proposes a rarer token; the target still verifies over the whole vocabulary and commits
its own choice, so the output does not change (greedy: token for token; sampling: the draft's q is zero there, which
the accept test handles). The KV a pass writes is unchanged, so its prefix-cache namespace is the inner runtime's.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Hashable, Iterator, Sequence

import torch

from specstruct.runtime.kv.layers import KVLayers
from specstruct.runtime.packed import KVSequence
from specstruct.runtime.quantized import PANEL, QuantLinear

if TYPE_CHECKING:
    from specstruct.runtime.model_runtime import ModelRuntime


def head_of(model: torch.nn.Module) -> QuantLinear | None:
    """The model's LM head where it is block-quantized (the only head this restriction computes), else None."""
    head = model.get_output_embeddings()  # type: ignore[operator]
    return head if isinstance(head, QuantLinear) else None


@contextlib.contextmanager
def restricted(head: QuantLinear, tokens: int) -> Iterator[None]:
    """For the forwards inside it: `head` computes the logits of token ids below `tokens` only (others -inf)."""
    panels = torch.arange(-(-tokens // PANEL))
    vocab, bias = head.out_features, head.bias
    width = min(vocab, len(panels) * PANEL)

    def forward(x: torch.Tensor) -> torch.Tensor:
        h = x.reshape(-1, x.shape[-1]).float()
        y = torch.full((h.shape[0], vocab), float("-inf"))
        part = head.qweight.linear_panels(h, panels)[:, :width]
        if isinstance(bias, torch.Tensor):
            part = part + bias[:width]
        y[:, :tokens] = part[:, :tokens]
        return y.view(*x.shape[:-1], vocab)

    head.forward = forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        del head.forward


class HeadRestricted:
    """A draft runtime whose passes compute the LM head over the first `tokens` token ids only (see module doc).
    Everything else is the inner runtime's."""

    def __init__(self, inner: ModelRuntime, tokens: int):
        head = head_of(inner.model)
        if head is None:
            raise ValueError("draft_head_tokens needs a draft whose LM head keeps GGUF blocks (a GGUF or registry "
                             "draft with weights='auto'); set draft_head_tokens=0 for this draft")
        if not 0 < tokens < head.out_features:
            raise ValueError(f"draft_head_tokens={tokens}: use 1..{head.out_features - 1} (the draft's vocabulary "
                             f"is {head.out_features}), or 0 for the whole head")
        self.inner, self.head, self.tokens = inner, head, tokens
        self.model: torch.nn.Module = inner.model
        self.vocab_size: int = inner.vocab_size
        self.numerics: str = f"{inner.numerics}; LM head over token ids below {tokens}"
        self.row_invariant: bool = inner.row_invariant
        self.packed: bool = inner.packed
        self.reuses_prefixes: bool = inner.reuses_prefixes
        self.max_length: int | None = inner.max_length
        self._key: Hashable = inner.cache_key  # the KV is the inner runtime's: only the logits differ

    @property
    def cache_key(self) -> Hashable:
        return self._key

    def sequence(self, layers: KVLayers | None = None, length: int = 0) -> KVSequence:
        return self.inner.sequence(layers, length)

    def forward(self, segments: Sequence[tuple[Any, Sequence[int]]], keep: Sequence[int],
                masks: Sequence[Sequence[torch.Tensor] | None] | None = None) -> list[torch.Tensor]:
        with restricted(self.head, self.tokens):
            return list(self.inner.forward(segments, keep, None))
