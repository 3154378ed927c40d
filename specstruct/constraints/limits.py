"""How much one compile may cost, and the cheap static checks that refuse explosive input early.

A server accepts user schemas and regexes, so no compile may take the process down or hold it:

- every compile runs in a child process under `memory_mb` (RLIMIT_AS) and `time_s`, killed past them: outlines_core
  builds its Index in native code that cannot be interrupted, and some short regexes make it run for minutes or
  allocate tens of GB (`(a{1,1000}){1,1000}`, `maxItems: 1e9` as `{0,999999999}`), in a worker process
  (isolate.py); llguidance's compile has no clock (a 200,000-alternative Lark grammar validates for minutes) and
  panics past 65,535 grammar symbols: a user's Lark grammar is compiled in a forked child that then keeps its
  matcher (grammar_worker.py), a JSON schema's first compile is a trial in a forked child (llguidance/bounded.py),
  and so are a request's tool parameter schemas (together), the tool-call grammar's first compile, and the check of
  a schema that needs no tokenizer (`check_spec`, which the CLI runs before loading a model);
- while generating, llguidance is bounded by its own fuel and size limits (`llguidance_limits()`), except for
  loops none of them stops: a user's Lark grammar's matcher stays in its child, each call under `mask_time_s`;
- before either, `check_regex` and `check_schema` refuse inputs whose size is out of bounds, naming the limit.

Every refusal is a ConstraintError that says which limit was hit and how to raise it. The defaults keep a
2-core, 24 GB machine safe; override them per process with `set_limits(...)` or the environment variables
SPECSTRUCT_COMPILE_TIME_S, SPECSTRUCT_COMPILE_MEMORY_MB, SPECSTRUCT_CONSTRAINT_CACHE_MB,
SPECSTRUCT_DISK_CACHE_MB, SPECSTRUCT_MAX_REPEAT, SPECSTRUCT_MAX_REGEX_SIZE, SPECSTRUCT_MAX_SCHEMA_DEPTH,
SPECSTRUCT_MAX_SCHEMA_BYTES, SPECSTRUCT_LEXER_FUEL, SPECSTRUCT_MASK_TIME_S (specstruct.settings, read at the
first `limits()`).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from specstruct.errors import ConstraintError
from specstruct.settings import VARIABLES, settings

# CompileLimits field -> its Settings field (the environment variable SPECSTRUCT_<upper-cased Settings field>)
_SETTING = {"time_s": "compile_time_s", "memory_mb": "compile_memory_mb", "cache_mb": "constraint_cache_mb"}
_VARIABLE = {v.field: v.name for v in VARIABLES}


@dataclass(frozen=True)
class CompileLimits:
    time_s: float = 30.0            # wall time of one compile, any kind or backend (its child killed past it)
    memory_mb: int = 4096           # address space a compile's child may add (RLIMIT_AS)
    cache_mb: int = 2048            # compiled constraints kept in memory (LRU by bytes)
    disk_cache_mb: int = 4096       # compiled indexes kept on disk (oldest files pruned past it)
    max_repeat: int = 10_000        # largest counted repetition {m,n} in a regex
    max_regex_size: int = 500_000   # regex size with counted repetitions expanded
    max_schema_depth: int = 128     # JSON nesting depth of a schema (objects and lists)
    max_schema_bytes: int = 4 << 20  # size of a JSON schema's text
    # llguidance lexer work (regex derivatives) allowed for one compile and for one token mask: about 0.3-0.6 s on
    # a 2-core Xeon. llguidance's default (200k per mask) stopped two corpus schemas mid-output; this admits them.
    lexer_fuel: int = 4_000_000
    # wall time of one call into a user's Lark grammar while generating (a mask, forced text, a token step): its
    # matcher runs in a forked child (grammar_worker.py), killed past it, as no llguidance limit stops every loop
    mask_time_s: float = 5.0

    def describe(self, name: str) -> str:
        env = _VARIABLE[_SETTING.get(name, name)]
        return (f"limit {name}={getattr(self, name)} (raise it with "
                f"specstruct.constraints.limits.set_limits({name}=...) or the environment variable {env})")


def _from_settings() -> CompileLimits:
    """The defaults, with the limits the environment sets."""
    given = dataclasses.asdict(settings())
    values = {f.name: given[_SETTING.get(f.name, f.name)] for f in dataclasses.fields(CompileLimits)}
    return dataclasses.replace(CompileLimits(), **{name: v for name, v in values.items() if v is not None})


_LIMITS: CompileLimits | None = None  # read from the settings at the first `limits()`, then set by `set_limits`


def limits() -> CompileLimits:
    global _LIMITS
    if _LIMITS is None:
        _LIMITS = _from_settings()
    return _LIMITS


def set_limits(**changes: Any) -> CompileLimits:
    """Replace some limits for this process (e.g. `set_limits(time_s=5, memory_mb=1024)`); returns the new ones."""
    global _LIMITS
    _LIMITS = dataclasses.replace(limits(), **changes)
    return _LIMITS


def too_complex(what: str, name: str, detail: str = "") -> ConstraintError:
    """The error for an input past limit `name`."""
    detail = f" ({detail})" if detail else ""
    return ConstraintError(f"{what} is too complex to compile{detail}: it exceeds the {limits().describe(name)}. "
                           "Simplify it (smaller bounds, fewer alternatives) or raise the limit.")


_LLGUIDANCE_WORDS = {  # words of an llguidance error -> (what it ran out of, the specstruct limit that raises it)
    "fuel": ("llguidance lexer fuel", "lexer_fuel"), "too many expressions": ("llguidance lexer fuel", "lexer_fuel"),
    "determine if regex is empty": ("llguidance lexer fuel", "lexer_fuel"),
    "lexer states": ("llguidance max_lexer_states", "memory_mb"),
    "grammar size": ("llguidance max_grammar_size", "memory_mb"),
    "too many items": ("llguidance step_max_items", "memory_mb"),
    "recursion limit": ("max_schema_depth", "max_schema_depth")}


def llguidance_limit(message: str) -> tuple[str, str] | None:
    """(what was exhausted, the limit that raises it) for an llguidance error about one of its limits, else None."""
    lower = message.lower()
    return next((hit for word, hit in _LLGUIDANCE_WORDS.items() if word in lower), None)


def llguidance_limits():
    """llguidance's own resource limits, scaled to `memory_mb` (a lexer state costs about 1-2 kB)."""
    from llguidance import LLParserLimits

    states = max(10_000, min(250_000, limits().memory_mb * 1024 // 4))
    # An Earley row holds ~4 items per optional property: the default 2000 fails mid-generation at ~500.
    fuel = limits().lexer_fuel
    return LLParserLimits(max_lexer_states=states, max_items_in_row=20_000, step_max_items=200_000,
                          initial_lexer_fuel=fuel, step_lexer_fuel=fuel, verbose_errors=False)


_COUNTED = re.compile(r"\{(\d+)(,(\d*))?\}")


def check_regex(regex: str, what: str = "the regex") -> None:
    """Refuse a regex whose counted repetitions are too large, alone or nested (static, linear time).

    The estimate is the regex's size with every `{m,n}` expanded n times (nested ones multiply): a
    determinising compiler builds at least that many states."""
    lim = limits()
    stack: list[float] = [0.0]   # size of the sequence being built, per open group
    last = 0.0                   # size of the last atom (what a quantifier applies to)
    i, n = 0, len(regex)
    while i < n:
        c = regex[i]
        if c == "\\":
            j = i + 2
            if j <= n and regex[i + 1] in "xupP" and j < n and regex[j] == "{":
                j = regex.find("}", j) + 1 or n
            last, i = 1.0, j
        elif c == "[":
            j = i + 1
            if j < n and regex[j] == "^":
                j += 1
            if j < n and regex[j] == "]":
                j += 1
            depth = 1
            while j < n and depth:
                if regex[j] == "\\":
                    j += 1
                elif regex[j] == "[":
                    depth += 1
                elif regex[j] == "]":
                    depth -= 1
                j += 1
            last, i = 1.0, j
        elif c == "(":
            stack.append(0.0)
            last, i = 0.0, i + 1
            continue
        elif c == ")":
            inner = stack.pop() if len(stack) > 1 else 0.0
            last, i = max(inner, 1.0), i + 1
        elif c == "|":
            i += 1
            continue
        elif c == "{" and (m := _COUNTED.match(regex, i)):
            low, high = int(m.group(1)), m.group(3)
            top = low if m.group(2) is None else (int(high) if high else low)
            if max(low, top) > lim.max_repeat:
                raise too_complex(what, "max_repeat", f"a counted repetition {m.group(0)} repeats more than "
                                  f"{lim.max_repeat} times")
            stack[-1] += last * (max(low, top, 1) - 1)
            last = last * max(low, top, 1)
            i = m.end()
            if stack[-1] > lim.max_regex_size:
                raise too_complex(what, "max_regex_size", "its counted repetitions expand to more than "
                                  f"{lim.max_regex_size} symbols")
            continue
        else:
            last, i = 1.0, i + 1
        stack[-1] += last
    if sum(stack) > lim.max_regex_size:
        raise too_complex(what, "max_regex_size", f"it expands to more than {lim.max_regex_size} symbols")


def _check_text(text: Any, where: str) -> None:
    """A lone surrogate (a JSON "\\ud800" escape) has no UTF-8 form: no compiler can read it, and llguidance's own
    error for it is misleading, so it is refused here by name."""
    if isinstance(text, str):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ConstraintError(f"{where} holds a lone surrogate ({text[e.start]!r} at character {e.start}), which "
                                  "is not valid Unicode and has no UTF-8 encoding: remove it or write the whole "
                                  "character (a surrogate pair)") from None


def check_schema(schema: Any, path: str = "#") -> None:
    """Refuse a schema nested deeper than `max_schema_depth` (iteratively: no RecursionError), or holding a lone
    surrogate in a key or string."""
    lim = limits()
    todo: list[tuple[Any, str, int]] = [(schema, path, 0)]
    while todo:
        node, where, depth = todo.pop()
        if depth > lim.max_schema_depth:
            raise too_complex("the JSON schema", "max_schema_depth", f"it nests deeper than "
                              f"{lim.max_schema_depth} levels at {where[:200]}")
        if isinstance(node, dict):
            for k in node:
                _check_text(k, f"the property name or keyword at {where[:200]}")
            todo.extend((v, f"{where}/{k}", depth + 1) for k, v in node.items())
        elif isinstance(node, str):
            _check_text(node, f"the string at {where[:200]}")
        elif isinstance(node, list):
            todo.extend((v, f"{where}/{i}", depth + 1) for i, v in enumerate(node))
