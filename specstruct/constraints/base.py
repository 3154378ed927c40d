"""What to compile and what a compiled constraint offers: the seam between the constraint compiler and the decoder.

The decoder (`specstruct.spec`) knows constraints only through the `Constraint` Protocol below, so a new backend
plugs in by returning an object with these methods from `compile_constraint`.
"""

from __future__ import annotations

import contextlib
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
    `fill_bitmask(out)` writes the same set as words (see `bitmask_words`) into `out`, an int32 tensor
    [bitmask_words(vocab_size)]: the form the decoder reads (a backend without it is read through `mask()`).
    """

    mode: Mode
    vocab_size: int

    def mask(self) -> "torch.Tensor": ...

    def fill_bitmask(self, out: "torch.Tensor") -> None:
        """Write the tokens legal next as bitmask words into `out` (int32 [bitmask_words(vocab_size)])."""
        ...

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


WORD_BITS = 32  # tokens per bitmask word


def bitmask_words(vocab_size: int) -> int:
    """Words of a bitmask over `vocab_size` tokens. The layout is llguidance's (and vLLM's, XGrammar's): int32 words,
    token t is bit t % 32 of word t // 32 (bit 0 the lowest), bits past the vocabulary zero."""
    return -(-vocab_size // WORD_BITS)


def pack_mask(mask: "torch.Tensor", out: "torch.Tensor | None" = None) -> "torch.Tensor":
    """The bitmask words of a bool mask [V], written into `out` (int32 [bitmask_words(V)]) when given."""
    import numpy as np
    import torch

    packed = np.packbits(mask.contiguous().numpy(), bitorder="little")  # little-endian bytes of the words
    words = out if out is not None else torch.empty(bitmask_words(mask.numel()), dtype=torch.int32)
    raw = words.view(torch.uint8).numpy()
    raw[: len(packed)] = packed
    raw[len(packed):] = 0
    return words


def unpack_words(words: "torch.Tensor", vocab_size: int) -> "torch.Tensor":
    """The bool mask [vocab_size] of bitmask words [bitmask_words(vocab_size)] (a new tensor)."""
    import numpy as np
    import torch

    raw = words.contiguous().view(torch.uint8).numpy()
    return torch.from_numpy(np.unpackbits(raw, count=vocab_size, bitorder="little").view(np.bool_))


def word_allows(words: "torch.Tensor", token: int) -> bool:
    """Whether bitmask words [W] let `token` through (one word read)."""
    return bool((int(words[token // WORD_BITS]) >> (token % WORD_BITS)) & 1)


def write_bitmask(constraint: Constraint, out: "torch.Tensor") -> None:
    """`constraint`'s legal set as bitmask words into `out`: its own `fill_bitmask`, or its `mask()` packed (a backend
    written before the words)."""
    try:
        fill = constraint.fill_bitmask  # (an isinstance check of a runtime Protocol costs ~10 us: this runs per position)
    except AttributeError:
        pack_mask(constraint.mask(), out)
        return
    fill(out)


def fill_bitmasks(constraint: Constraint, tokens: Sequence[int], out: "torch.Tensor") -> None:
    """The bitmask of every position of a draft into one buffer `out` (int32 [len(tokens) + 1, W]): row 0 here, row
    i + 1 after tokens[:i + 1]. Walks `constraint` itself and rolls it back (no copy of the state); a token it refuses
    leaves the state where it was, so the next rows repeat the last one."""
    write_bitmask(constraint, out[0])
    moved = 0
    try:
        for i, t in enumerate(tokens):
            moved += constraint.advance([t])
            write_bitmask(constraint, out[i + 1])
    except BaseException:
        with contextlib.suppress(Exception):  # the state may be broken: the error that broke it is the one to see
            constraint.rollback(moved)
        raise
    constraint.rollback(moved)


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
