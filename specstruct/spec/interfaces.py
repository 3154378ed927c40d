"""The seams of the decoder, as Protocols so test doubles need no inheritance.

    batch -> {proposers (Proposer: Drafter, BatchProposer), policy (Policy), runtime (Runtime), verify};
    constraints via Constraint

Nothing here imports torch at module level beyond typing; implementations live in their own modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Hashable, Iterable, Protocol, Sequence, TypeVar, runtime_checkable

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


@dataclass(frozen=True)
class Proposal:
    """A row's candidates for one pass: the tokens, each one's drafter distribution q (None: a point mass, as for
    the free proposers and greedy rows), and which proposer made which run of them (name, count), in order."""

    tokens: tuple[int, ...] = ()
    qs: "tuple[torch.Tensor | None, ...]" = ()
    segments: tuple[tuple[str, int], ...] = ()


def encode(tokenizer: Any, text: str) -> list[int]:
    """`text` as the tokenizer writes it, without special tokens: the free drafters' candidates."""
    return list(tokenizer.encode(text, add_special_tokens=False))


class Sizing(Enum):
    """How the policy sizes a proposer's share of a step (a trait of the proposer, so the policy needs no names)."""

    CAP = "cap"  # free and exact when right: always the mode's cap (forced text, structure guesses)
    COPY = "copy"  # a guess, then a copy: two acceptance rates, the first token's and the copy's (prompt lookup)
    LEARNED = "learned"  # grows while accepted, shrinks below the threshold; a model-step proposer is also cost-gated


@dataclass(frozen=True)
class Traits:
    """What the policy, the row and the batch know of a proposer, instead of its name."""

    name: str  # its key in the policy's statistics and in a result's per-drafter stats
    switch: str  # the SpecConfig flag that turns it on
    sizing: Sizing
    model_step: bool = False  # runs a model: costs a step per token, proposes for every row at once (BatchProposer)
    reads_text: bool = False  # whether `propose` wants the context as text (the row keeps it, decoded incrementally)
    per_tenant: bool = False  # a TenantDrafter: `propose` reads the request's tenant, finished requests are remembered


@dataclass(frozen=True)
class Setup:
    """What a proposer may be built from (proposers/registry.py): the tokenizer, the EOS ids, the draft runtime."""

    tokenizer: Any
    eos: frozenset[int]
    draft: "Runtime | None" = None


@runtime_checkable
class Proposer(Protocol):
    """A candidate source, seen through its `traits`. Every proposer is one of the two shapes below, registered once
    in proposers/registry.py (the order there is the order of a step's candidates)."""

    traits: Traits

    @property
    def name(self) -> str: ...


@runtime_checkable
class Drafter(Proposer, Protocol):
    """A free proposer (`model_step` False): proposes for one row from its context and constraint."""

    def propose(self, context: Sequence[int], constraint: Constraint, k: int, temperature: float,
                text: str | None = None, room: int | None = None) -> Draft:
        """Up to k tokens continuing `context` (prompt + committed tokens). `constraint` is a fork positioned
        at the end of `context`; the drafter advances it over what it proposes. `text`: `context` decoded, given
        to drafters that read text (a drafter decodes `context` itself when it is None). `room` (at least k): the
        most the step can take, which a drafter may use past k where it knows more than the policy's length."""
        ...


@runtime_checkable
class TenantDrafter(Drafter, Protocol):
    """A free proposer that learns from a tenant's finished requests (`per_tenant` True): the row passes `tenant`
    (its `cache_salt`) to `propose`, and a request that finished with the proposer switched on is `remember`ed under
    its tenant. Nothing one tenant's requests taught it may be proposed to another."""

    def propose(self, context: Sequence[int], constraint: Constraint, k: int, temperature: float,
                text: str | None = None, room: int | None = None, tenant: Hashable = None) -> Draft: ...

    def remember(self, tenant: Hashable, ids: Sequence[int]) -> None:
        """A finished request of `tenant`: its prompt and output as token ids."""
        ...


J = TypeVar("J", contravariant=True)


@runtime_checkable
class BatchProposer(Proposer, Protocol[J]):
    """A model-step proposer (`model_step` True): proposes for every row of a step in packed passes of its own
    runtime (as vLLM's batch_propose), after the free proposers, each row's job saying what to draft from."""

    runtime: "Runtime"

    def propose_batch(self, jobs: Sequence[J], costs: list[tuple[int, float]]) -> None:
        """Fill each job's proposal in place; append (rows, seconds) of each one-token pass to `costs`."""
        ...


@dataclass
class Plan:
    """What one decoding step drafts: a total candidate budget `k`, the drafters to use in order, and the most
    tokens each of them may propose (`limits[name]`)."""

    k: int
    drafters: list[str] = field(default_factory=list)
    limits: dict[str, int] = field(default_factory=dict)


class RowCopyRates(Protocol):
    """A row's own first-token rates of its copying proposers, as the policy reads them (policy.RowRates)."""

    first: dict[str, float]  # proposer -> the row's own first-token rate

    def length(self, drafter: str, k: int) -> int: ...

    def rate(self, drafter: str, mode_rate: float) -> float: ...


@runtime_checkable
class Policy(Protocol):
    """What the row and the batch ask of the policy (policy.AdaptivePolicy; batch_policy.py reads its costs)."""

    def plan(self, mode: Mode, config: "SpecConfig | None" = None, alone: bool = True, unread: int = 0,
             own: RowCopyRates | None = None) -> Plan: ...

    def observe(self, mode: Mode, drafter: str, proposed: int, accepted: int,
                config: "SpecConfig | None" = None) -> None: ...

    def observe_cost(self, kind: str, rows: int, seconds: float) -> None: ...

    def observe_step(self, mode: Mode, with_model: bool, tokens: int, seconds: float) -> None: ...

    def model_rate(self, mode: Mode) -> float | None:
        """The model-step proposer's acceptance rate in `mode` (None before it was measured)."""
        ...

    def candidate_rates(self, mode: Mode, segments: Iterable[tuple[str, int]], default: float,
                        own: RowCopyRates | None = None) -> list[float]:
        """Per candidate of a step, its proposer's acceptance rate (`default` before it was measured; `own`: the
        row's rates, whose first-token rate a copy's first candidate takes)."""
        ...


class Sequence_(Protocol):
    """One sequence's KV cache on a runtime (what Runtime.sequence() returns)."""

    length: int

    def layers(self) -> list[Any]:
        """Copies of its (key, value) per layer, to keep."""
        ...

    def views(self) -> list[Any]:
        """Its (key, value) per layer as views, for a caller that copies what it keeps (the prefix cache)."""
        ...

    def crop(self, length: int) -> None: ...


@runtime_checkable
class Runtime(Protocol):
    """A causal LM with per-sequence KV caches: `sequence` makes one, `forward` runs one pass over the segments of
    many (the batch decoder's only call: prefill chunks, draft steps and verification alike)."""

    vocab_size: int
    numerics: str  # what computes: weight format, kernels (a result's stats.numerics names it)
    row_invariant: bool  # a row's logits do not depend on the other rows of a pass (batched == alone, bitwise)
    packed: bool  # the rows of a pass share one packed attention (its KV spans may be kept and reused)
    reuses_prefixes: bool  # a cached prefix's KV is bitwise what prefilling it cold gives (the prefix cache may serve)
    max_length: int | None  # the most positions a sequence may hold (None: the model names no limit)

    @property
    def cache_key(self) -> Hashable:
        """Its namespace in a prefix cache (model and numerics)."""
        ...

    def sequence(self, layers: "list[Any] | None" = None, length: int = 0) -> Sequence_:
        """A new sequence: empty, or holding `layers` ([(key, value)] per layer, `length` positions; copied)."""
        ...

    def forward(self, segments: Sequence[tuple[Any, Sequence[int]]], keep: Sequence[int],
                masks: "Sequence[Sequence[torch.Tensor] | None] | None" = None) -> "list[torch.Tensor]":
        """One pass appending each segment's tokens to its sequence (one this runtime made: ModelRuntime's are
        runtime.packed.KVSequence); logits [keep[i], vocab] of each segment's
        last keep[i] tokens. `masks[i]`, when given, holds the constraint's bitmask words of each of those positions:
        logits a mask excludes need not be computed (they may be -inf)."""
        ...
