"""The final value check's regex keywords (`pattern`, `patternProperties`, `additionalProperties`) without Python's
backtracking `re`.

jsonschema runs `re.search` on the schema's patterns: a user's pattern such as `^(?:(a|aa)+b)?a{42}$` makes that
exponential (42 s for one 42-character string) and, in a server, stalls every request. Here the patterns run in
the `regex` module under a time budget shared by one validation (`PATTERN_BUDGET_S`). A pattern that does not
finish within it, or that the `regex` module cannot read (ECMA/Rust syntax), is not checked again: the output was
generated under the compiled constraint, which already enforces every pattern, so the check is a second opinion
and never worth stalling the process for.
"""

from __future__ import annotations

import time
from typing import Any

import regex

PATTERN_BUDGET_S = 0.25  # regex time one validation may spend on patterns before it trusts the constraint


class _Budget:
    def __init__(self, seconds: float):
        self.left = seconds

    def search(self, pattern: str, text: str) -> bool | None:
        """Whether `pattern` matches somewhere in `text`; None when it could not be decided within the budget."""
        if self.left <= 0:
            return None
        start = time.monotonic()
        try:
            return regex.search(pattern, text, timeout=self.left) is not None
        except (TimeoutError, regex.error, OverflowError, ValueError):
            return None
        finally:
            self.left -= time.monotonic() - start


def linear_validator(validator_cls: Any, schema: Any, budget_s: float = PATTERN_BUDGET_S) -> Any:
    """A `validator_cls` for `schema` whose regex keywords run under a time budget; its `iter_errors(instance)`
    gives each validation the whole budget."""
    from jsonschema import ValidationError, validators

    budget = _Budget(budget_s)

    def pattern(validator, patrn, instance, schema):
        if validator.is_type(instance, "string") and budget.search(patrn, instance) is False:
            yield ValidationError(f"{instance!r} does not match {patrn!r}")

    def pattern_properties(validator, patterns, instance, schema):
        if validator.is_type(instance, "object"):
            for patrn, subschema in patterns.items():
                for k, v in instance.items():
                    if budget.search(patrn, k):
                        yield from validator.descend(v, subschema, path=k, schema_path=patrn)

    def additional_properties(validator, extra_schema, instance, schema):
        if not validator.is_type(instance, "object"):
            return
        known, patterns = schema.get("properties", {}), list(schema.get("patternProperties", {}))
        # a key the budget could not decide counts as matched: the constraint already placed it
        extras = [k for k in instance if k not in known and not any(budget.search(p, k) is not False
                                                                     for p in patterns)]
        if validator.is_type(extra_schema, "object"):
            for k in extras:
                yield from validator.descend(instance[k], extra_schema, path=k)
        elif not extra_schema and extras:
            yield ValidationError(f"additional properties are not allowed ({', '.join(map(repr, sorted(extras)))} "
                                  "unexpected)")

    cls = validators.extend(validator_cls, {"pattern": pattern, "patternProperties": pattern_properties,
                                            "additionalProperties": additional_properties})
    return _Checked(cls(schema), budget, budget_s)


class _Checked:
    def __init__(self, validator: Any, budget: _Budget, budget_s: float):
        self.validator, self._budget, self._budget_s = validator, budget, budget_s

    def iter_errors(self, instance: Any):
        self._budget.left = self._budget_s  # each validation gets the whole budget
        return self.validator.iter_errors(instance)
