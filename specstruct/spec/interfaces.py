"""The seams of the decoder, as Protocols so test doubles need no inheritance.

    engine -> {drafting (Drafter), policy (Policy), runtime (Runtime), verify} ; constraints via Constraint

Nothing here imports torch at module level beyond typing; implementations live in their own modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Sequence, TypeVar, runtime_checkable

from specstruct.constraints.base import Constraint, Mode

if TYPE_CHECKING:
    import torch

    from specstruct.config import SpecConfig


@dataclass
class Draft:
    """Candidate tokens from one drafter. `q` holds the drafter's (masked, renormalised) distribution per
    token, shape [len(tokens), vocab]; None means a point mass on each token (zero-cost drafters)."""

    tokens: list[int]
    q: "torch.Tensor | None" = None
    source: str = ""

    @classmethod
    def legal(cls, ids: Sequence[int], constraint: Constraint, source: str) -> "Draft":
        """The longest prefix of `ids` the constraint takes, with `constraint` advanced over it (a free drafter's
        canonical tokenization of its text may overshoot what the grammar allows)."""
        n = constraint.advance(ids)
        return cls(list(ids[:n]), source=source)


def encode(tokenizer: Any, text: str) -> list[int]:
    """`text` as the tokenizer writes it, without special tokens: the free drafters' candidates."""
    return list(tokenizer.encode(text, add_special_tokens=False))


@runtime_checkable
class Drafter(Protocol):
    """Proposes candidates for the target to verify. (What was accepted is learned by the Policy, not here.)"""

    name: str
    reads_text: bool  # whether `propose` wants the context as text (the row keeps it, decoded incrementally)

    def propose(self, context: Sequence[int], constraint: Constraint, k: int, temperature: float,
                text: str | None = None, room: int | None = None) -> Draft:
        """Up to k tokens continuing `context` (prompt + committed tokens). `constraint` is a fork positioned
        at the end of `context`; the drafter advances it over what it proposes. `text`: `context` decoded, given
        to drafters that read text (a drafter decodes `context` itself when it is None). `room` (at least k): the
        most the step can take, which a drafter may use past k where it knows more than the policy's length."""
        ...


@dataclass
class Plan:
    """What one decoding step drafts: a total candidate budget `k`, the drafters to use in order, and the most
    tokens each of them may propose (`limits[name]`)."""

    k: int
    drafters: list[str] = field(default_factory=list)
    limits: dict[str, int] = field(default_factory=dict)


@runtime_checkable
class Policy(Protocol):
    def plan(self, mode: Mode, config: "SpecConfig | None" = None, alone: bool = True) -> Plan: ...

    def observe(self, mode: Mode, drafter: str, proposed: int, accepted: int,
                config: "SpecConfig | None" = None) -> None: ...

    def observe_cost(self, kind: str, rows: int, seconds: float) -> None: ...

    def observe_step(self, mode: Mode, with_model: bool, tokens: int, seconds: float) -> None: ...


class Sequence_(Protocol):
    """One sequence's KV cache on a runtime (what Runtime.sequence() returns)."""

    length: int

    def crop(self, length: int) -> None: ...


S = TypeVar("S", bound=Sequence_)  # a runtime's own sequence type (ModelRuntime: runtime.packed.KVSequence)


@runtime_checkable
class Runtime(Protocol[S]):
    """A causal LM with per-sequence KV caches: `sequence` makes one, `forward` runs one pass over the segments of
    many (the batch decoder's only call: prefill chunks, draft steps and verification alike)."""

    vocab_size: int
    numerics: str  # what computes: weight format, kernels (a result's stats.numerics names it)

    def sequence(self) -> S:
        """A new, empty sequence."""
        ...

    def forward(self, segments: Sequence[tuple[S, Sequence[int]]], keep: Sequence[int],
                masks: "Sequence[Sequence[torch.Tensor] | None] | None" = None) -> "list[torch.Tensor]":
        """One pass appending each segment's tokens to its sequence; logits [keep[i], vocab] of each segment's
        last keep[i] tokens. `masks[i]`, when given, holds the constraint's bool mask of each of those positions:
        logits a mask excludes need not be computed (they may be -inf)."""
        ...
