"""The seams between modules, as Protocols so test doubles need no inheritance.

    api -> engine -> {drafting, verify, policy, runtime, constraints}

Nothing here imports torch at module level beyond typing; implementations live in their own modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:
    import torch

Mode = Literal["json", "regex", "choice", "grammar", "code", "text"]
Kind = Literal["json", "regex", "choice", "grammar", "code", "text"]


@dataclass(frozen=True)
class ConstraintSpec:
    """What to compile. `source` is a JSON-schema string (json), a regex (regex), a JSON list of
    strings (choice), a Lark grammar (grammar) or None (text, code)."""

    kind: Kind
    source: str | None
    mode: Mode


@runtime_checkable
class Constraint(Protocol):
    """A compiled constraint with an explicit, rollback-able matcher state.

    `mask()` returns a bool tensor [vocab_size] of tokens legal next (EOS included exactly where the
    output is complete). The tensor may be cached and shared: never modify it in place.
    """

    mode: Mode
    vocab_size: int

    def mask(self) -> "torch.Tensor": ...

    def advance(self, tokens: Sequence[int]) -> int:
        """Consume tokens in order; stop at the first illegal one. Returns how many were consumed."""
        ...

    def rollback(self, n: int) -> None:
        """Undo the last n consumed tokens."""
        ...

    def forced_text(self) -> str:
        """Text the grammar forces next from this state ('' when there is a choice)."""
        ...

    def is_final(self) -> bool:
        """True when the output so far is complete (EOS is legal)."""
        ...

    def fork(self) -> "Constraint":
        """An independent copy of the current state (for drafting ahead)."""
        ...

    def accepts(self, text: str) -> bool:
        """Tokenize `text` as the engine would, walk it through the automaton, and report whether it is complete."""
        ...


@dataclass
class Draft:
    """Candidate tokens from one drafter. `q` holds the drafter's (masked, renormalised) distribution per
    token, shape [len(tokens), vocab]; None means a point mass on each token (zero-cost drafters)."""

    tokens: list[int]
    q: "torch.Tensor | None" = None
    source: str = ""


@runtime_checkable
class Drafter(Protocol):
    """Proposes candidates for the target to verify, then learns how many were accepted."""

    name: str

    def propose(self, context: Sequence[int], constraint: Constraint, k: int, temperature: float) -> Draft:
        """Up to k tokens continuing `context` (prompt + committed tokens). `constraint` is a fork positioned
        at the end of `context`; the drafter advances it over what it proposes."""
        ...

    def observe(self, proposed: int, accepted: int) -> None: ...


@dataclass
class Plan:
    """What one decoding step drafts: a total candidate budget `k`, the drafters to use in order, and the most
    tokens each of them may propose (`limits[name]`)."""

    k: int
    drafters: list[str] = field(default_factory=list)
    limits: dict[str, int] = field(default_factory=dict)


@runtime_checkable
class Policy(Protocol):
    def plan(self, mode: Mode) -> Plan: ...

    def observe(self, mode: Mode, drafter: str, proposed: int, accepted: int) -> None: ...

    def observe_cost(self, kind: str, rows: int, seconds: float) -> None: ...


@runtime_checkable
class Runtime(Protocol):
    """A causal LM plus its KV cache."""

    vocab_size: int

    def prefill(self, ids: Sequence[int]) -> "torch.Tensor":
        """Reset the cache, run the prompt, return logits of the last position [vocab]."""
        ...

    def extend(self, ids: Sequence[int]) -> "torch.Tensor":
        """Append tokens to the cache, return their logits [len(ids), vocab]."""
        ...

    def crop(self, length: int) -> None:
        """Drop cached positions beyond `length`."""
        ...

    @property
    def length(self) -> int: ...
