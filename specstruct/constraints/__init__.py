"""Output type -> token automaton. `compile_constraint(spec, tokenizer, ...)` is the entry point; everything the
decoder needs from a compiled constraint is the `Constraint` Protocol in `base`.

    base         ConstraintSpec (what to compile), Constraint (the Protocol the decoder uses)
    compiler     compile_constraint: dispatch per kind, in-memory and disk caches
    limits       CompileLimits (time, memory, cache sizes, static size checks) and set_limits
    cache        the on-disk cache folder, atomic writes and pruning; the byte-bounded LRU
    llguidance/  the default backend: JSON schemas, Lark grammars (a user's in a killable child)
    outlines/    the outlines_core backend: regexes, choices, JSON schemas as regexes
    schema/      JSON schema checks and normalisation shared by both backends
    tools/       tool calls as a grammar
"""

from specstruct.constraints.base import Constraint, ConstraintSpec, Mode
from specstruct.constraints.compiler import check_spec, compile_constraint, prepare

__all__ = ["Constraint", "ConstraintSpec", "Mode", "check_spec", "compile_constraint", "prepare"]
