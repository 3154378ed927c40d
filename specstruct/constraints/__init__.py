"""Output type -> token automaton. `compile_constraint(spec, tokenizer, ...)` is the entry point; everything the
decoder needs from a compiled constraint is the `Constraint` Protocol in `base`.

    base            ConstraintSpec (what to compile), Constraint (the Protocol the decoder uses)
    compiler        compile_constraint: dispatch per kind, in-memory and disk caches
    token_table     the tokenizer's vocabulary as bytes (for outlines_core and llguidance)
    automaton       outlines_core Index -> AutomatonConstraint / FreeTextConstraint (masks, fork, rollback)
    grammar         llguidance Lark grammars -> GrammarConstraint
    regexes         JSON schema / choice -> regex; schema_check, schema_normalise and numeric_regex prepare
                    schemas for outlines_core (keyword checks, $ref/allOf folding, numeric bounds)
    cache           the on-disk cache folder and atomic writes
"""

from specstruct.constraints.base import Constraint, ConstraintSpec, Mode
from specstruct.constraints.compiler import check_spec, compile_constraint

__all__ = ["Constraint", "ConstraintSpec", "Mode", "check_spec", "compile_constraint"]
