"""Structure guesses: where a JSON grammar has a choice but one answer is structural and likely, propose it, then
the text the grammar forces after it.

  - a string may end here     where prompt lookup's source goes on with a clause's end (`Hopper, 85`, `Kyoto;`),
                              propose its closing quote and end (`",`, else `"}`, else `"]`)
  - a number may end here     propose its end (`,`, else `}`, else `]`: the first the grammar takes)
  - a key opens here          propose the next property the schema declares (in its order) that the grammar takes
  - an object or array closes  propose `,` (another item or property follows)
  - a value opens here        where the grammar lets it be a string or an object (or null, a number, ...): `"`,
                              else `{` (the target writes the first letters of the value as its bonus token)

An extraction writes `"age": 47` then `,` and the next key; the target spends one pass on each digit and one on the
end, and with forced text alone it spends another on each optional key (the grammar cannot force `"age"` where the
schema lets it be skipped). After the digits the lookup copied (or the one the target just wrote) this drafter
proposes `, "occupation": "`: right, it saves a pass; wrong, it costs the rows it proposed, which a pass verifies
for a few percent of its time each. The guesses are candidates like any other: the target verifies every token.

Runs after prompt lookup, so it also ends the numbers the lookup copies and proposes the forced text after a copy.
"""

from __future__ import annotations

from typing import Any, Sequence

from specstruct.constraints.base import Constraint
from specstruct.spec.interfaces import Draft, Setup, Sizing, Traits, encode
from specstruct.spec.proposers.lookup import CLAUSE_END, copy_from, in_string

ENDS = (",", "}", "]")  # a number's end, most likely first
MAX_KEYS = 32  # keys tried at one choice point (each a grammar probe), from the one after the key written last
TAIL = 400  # characters of the context's end read for the key written last
ROUNDS = 3  # guesses chained in one proposal (a number's end, then the next key, then ...)
CHARS_PER_K = 16  # characters of the proposal's text read per candidate allowed: more cannot fit in k tokens


def _last_key(text: str, keys: Sequence[str]) -> int:
    """The index in `keys` of the key written last in `text` (its `"key":` nearest the end), or -1."""
    best, at = -1, -1
    for i, key in enumerate(keys):
        pos = text.rfind(f'"{key}":')
        if pos > at:
            best, at = i, pos
    return best


class StructureGuessDrafter:
    traits = Traits("guess", switch="use_structure_guesses", sizing=Sizing.CAP, reads_text=True)
    name = traits.name

    @classmethod
    def create(cls, setup: Setup) -> "StructureGuessDrafter":
        return cls(setup.tokenizer)

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def _takes(self, constraint: Constraint, text: str) -> Constraint | None:
        """A fork of `constraint` advanced over `text` (canonically tokenized), or None where the grammar refuses."""
        ids = encode(self.tokenizer, text)
        probe = constraint.fork()
        return probe if probe.advance(ids) == len(ids) else None

    def propose(self, context: Sequence[int], constraint: Constraint, k: int, temperature: float,
                text: str | None = None, room: int | None = None) -> Draft:
        if k <= 0 or constraint.mode != "json" or not context:
            return Draft([], source=self.name)
        if text is None:
            text = self.tokenizer.decode(list(context)[-64:])
        keys: Sequence[str] = getattr(constraint, "keys", ())
        out = constraint.forced_text()
        for _ in range(ROUNDS):
            if len(encode(self.tokenizer, out[: CHARS_PER_K * k])) >= k:  # the proposal is full: no more probes
                break
            guess = self._guess(constraint, text + out, out, keys)
            if guess is None:
                break
            out += guess[0] + guess[1].forced_text()
        if not out:
            return Draft([], source=self.name)
        ids = encode(self.tokenizer, out[: CHARS_PER_K * k])
        if len(out) > CHARS_PER_K * k:
            ids = ids[:-1]  # cut inside a word: its last token may be a fragment
        return Draft.legal(ids[:k], constraint, self.name)

    def _first(self, constraint: Constraint, out: str, options: Sequence[str]) -> tuple[str, Constraint] | None:
        """The first of `options` the grammar takes after `out`, with the fork advanced over both, or None."""
        for option in options:
            probe = self._takes(constraint, out + option)
            if probe is not None:
                return option, probe
        return None

    def _guess(self, constraint: Constraint, text: str, out: str,
               keys: Sequence[str]) -> tuple[str, Constraint] | None:
        """The structural text likely next after `out` (whose grammar state is a choice; `text` ends with it) and
        the constraint advanced over both, or None."""
        tail = text[-TAIL:]
        if in_string(tail) and (at := copy_from(text, json=True)) >= 0 and CLAUSE_END.match(text, at):
            return self._first(constraint, out, [f'"{end}' for end in ENDS])
        if tail[-1:].isdigit():
            if self._takes(constraint, out + '"') is not None:  # a digit inside a string: no number ends here
                return None
            return self._first(constraint, out, ENDS)
        opened = tail.rstrip()
        if opened.endswith('":') or (opened.endswith("[") and opened[:-1].rstrip()[-1:] in (":", ",", "[")):
            return self._first(constraint, out, ('"', "{"))
        if tail[-1:] in ("}", "]"):
            return self._first(constraint, out, (",",))
        if keys and tail.endswith('"') and tail[:-1].rstrip()[-1:] in ("{", ","):
            start = _last_key(tail, keys) + 1
            for i in range(min(MAX_KEYS, len(keys))):
                key = f'{keys[(start + i) % len(keys)]}"'
                probe = self._takes(constraint, out + key)
                if probe is not None and probe.forced_text().startswith(":"):  # a key, not a string in an array
                    return key, probe
        return None
