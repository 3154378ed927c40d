"""Output type -> token automaton. `compile_constraint(spec, tokenizer, ...)` is the entry point; everything the
decoder needs from a compiled constraint is the `Constraint` Protocol in `base`.

    base            ConstraintSpec (what to compile), Constraint (the Protocol the decoder uses)
    compiler        compile_constraint: dispatch per kind, in-memory and disk caches
    limits          CompileLimits (time, memory, cache sizes, static size checks) and set_limits
    isolate         outlines_core Index builds in a bounded worker process (_index_worker.py)
    json_llguidance JSON schemas through llguidance's JSON compiler (the default JSON backend)
    token_table     the tokenizer's vocabulary as bytes (for outlines_core and llguidance)
    automaton       outlines_core Index -> AutomatonConstraint / FreeTextConstraint (masks, fork, rollback)
    grammar         llguidance matchers (Lark grammars, JSON schemas) -> GrammarConstraint
    regexes         JSON schema / choice -> regex (json_backend="outlines"); schema_check, schema_normalise and
                    numeric_regex prepare schemas for outlines_core (keyword checks, $ref/allOf folding, bounds)
    cache           the on-disk cache folder, atomic writes and pruning; the byte-bounded LRU
"""

from specstruct.constraints.base import Constraint, ConstraintSpec, Mode
from specstruct.constraints.compiler import check_spec, compile_constraint

__all__ = ["Constraint", "ConstraintSpec", "Mode", "check_spec", "compile_constraint"]
