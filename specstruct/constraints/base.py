"""What to compile and what a compiled constraint offers: the seam between the constraint compiler and the decoder.

The decoder (`specstruct.spec`) knows constraints only through the `Constraint` Protocol below, so a new backend
plugs in by returning an object with these methods from `compile_constraint`.
"""

from __future__ import annotations

import warnings
from dataclasses import InitVar, dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:
    import torch

Mode = Literal["json", "regex", "choice", "grammar", "code", "text"]


@dataclass(frozen=True)
class ConstraintSpec:
    """What to compile. `source` is a JSON-schema string (json), a regex (regex), a JSON list of
    strings (choice), a Lark grammar (grammar) or None (text, code). `kind` is also the output mode (`mode`)."""

    kind: Mode
    source: str | None
    legacy_mode: InitVar[Mode | None] = None  # the former third field, always equal to `kind`: deprecated

    def __post_init__(self, legacy_mode: Mode | None) -> None:
        if legacy_mode is None:
            return
        if legacy_mode != self.kind:
            raise ValueError(f"ConstraintSpec({self.kind!r}, ..., {legacy_mode!r}): the mode is the kind; pass "
                             f"ConstraintSpec({self.kind!r}, source)")
        warnings.warn("ConstraintSpec's third argument is deprecated (the mode is the kind): pass "
                      "ConstraintSpec(kind, source)", DeprecationWarning, stacklevel=3)

    @property
    def mode(self) -> Mode:
        """The output mode: the kind."""
        return self.kind

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


def output_text(text: object) -> str:
    """`text` for Constraint.accepts, or TypeError naming what was given (a value, bytes, None)."""
    if not isinstance(text, str):
        raise TypeError(f"accepts() takes the output text as a str, got {type(text).__name__}; for a value, "
                        "pass json.dumps(value)")
    return text


def finished(constraint: Any, eos_ids: Any) -> bool:
    """Whether an output that max_new_tokens stopped is the whole value: the constraint is final and allows nothing
    but the end. Final alone is not enough: Choice(["a", "abc"]) is final after "a", and "123" of an integer the
    model was still writing parses, but neither is what the model was writing."""
    if not constraint.is_final():
        return False
    legal = constraint.mask().clone()
    legal[[e for e in eos_ids if e < legal.shape[0]]] = False
    return not bool(legal.any())
