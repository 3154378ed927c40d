"""Every SPECSTRUCT_* environment variable, read in this one module, once per process.

`settings()` parses the environment on first use into a frozen `Settings`: each field is one variable, with its
type, its default and a one-line doc (`VARIABLES`; docs/settings.md's Environment table lists the same ones). Every
other module reads its value from here (tests/unit/test_settings_env.py keeps it so). An empty value counts as
unset; a bad value is a SettingsError naming the variable, the value and what it accepts, at the first read.

The environment is read once, so changing it later changes nothing until `cache_clear()` (tests call it after
monkeypatching a variable; the next `settings()` reads the environment again). `overridden(linear="onednn")`
replaces some values for a block, process-wide (benchmarks comparing kernels), and never writes the environment.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Literal, Mapping, TypeVar, cast, get_args

from specstruct.errors import SettingsError

__all__ = ["Settings", "Variable", "VARIABLES", "settings", "cache_clear", "overridden", "read", "SettingsError"]

T = TypeVar("T")

LinearKernel = Literal["fixed", "onednn"]
Attention = Literal["cpp", "torch"]
JsonBackend = Literal["llguidance", "outlines"]
LogLevel = Literal["critical", "error", "warning", "info", "debug", "trace"]  # uvicorn's


@dataclass(frozen=True)
class Variable:
    """One environment variable: how it reads, and how docs and errors name it."""

    name: str                        # SPECSTRUCT_...
    doc: str                         # what it sets, one line
    what: str                        # what a value is, for the error ("a linear kernel")
    parse: Callable[[str], object]   # its value from the text; ValueError(what it accepts) when bad
    shown: str                       # the default, as docs/settings.md writes it
    field: str = ""                  # the Settings attribute (filled in by VARIABLES)


def _choice(values: tuple[str, ...]) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        name = raw.strip().lower()
        if name not in values:
            raise ValueError(f"one of {values}")
        return name
    return parse


def _number(kind: Callable[[float], T]) -> Callable[[str], T]:
    def parse(raw: str) -> T:
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value >= 0):
            raise ValueError("a number >= 0")
        return kind(value)  # int or float, as the field is
    return parse


def _text(raw: str) -> str:
    return raw.strip()


def _secret(raw: str) -> str:
    return raw


def _path(raw: str) -> Path:
    return Path(raw.strip()).expanduser()


def _cache_root() -> Path:
    return Path.home() / ".cache" / "specstruct"


def _models_root() -> Path:
    return _cache_root() / "models"


def _var(name: str, doc: str, parse: Callable[[str], T], default: T, what: str = "", shown: str = "") -> T:
    """A Settings field read from `name`."""
    variable = Variable(name, doc, what or "a value", parse, shown or f"`{default}`")
    return field(default=default, metadata={"variable": variable})


def _path_var(name: str, doc: str, default: Callable[[], Path], shown: str) -> Path:
    """A Settings field read from `name`, a folder whose default depends on the user's home."""
    variable = Variable(name, doc, "a path", _path, shown)
    return field(default_factory=default, metadata={"variable": variable})


def _limit(name: str, kind: Callable[[float], T], shown: str, doc: str) -> T | None:
    """A compile limit (specstruct.constraints.limits.CompileLimits): None leaves CompileLimits' default."""
    variable = Variable(name, doc, "a compile limit", _number(kind), shown)
    return field(default=None, metadata={"variable": variable})


@dataclass(frozen=True)
class Settings:
    """Every SPECSTRUCT_* setting, as read from the environment (defaults where unset)."""

    home: Path = _path_var("SPECSTRUCT_HOME", "where `specstruct pull` puts converted models", _models_root,
                           "`~/.cache/specstruct/models`")
    cache: Path = _path_var("SPECSTRUCT_CACHE", "compiled constraints, KV spill files, GGUF metadata, benchmark GGUFs "
                            "(each in its own subfolder)", _cache_root, "`~/.cache/specstruct`")
    json_backend: JsonBackend = _var(
        "SPECSTRUCT_JSON_BACKEND", "what compiles a JSON schema (docs/conformance.md)",
        cast(Callable[[str], JsonBackend], _choice(get_args(JsonBackend))), "llguidance", "a JSON backend")
    linear: LinearKernel = _var(
        "SPECSTRUCT_LINEAR", "the float32 Linear kernel: specstruct's fixed-order one, or oneDNN's",
        cast(Callable[[str], LinearKernel], _choice(get_args(LinearKernel))), "fixed", "a linear kernel")
    attention: Attention = _var(
        "SPECSTRUCT_ATTENTION", "the row-wise attention: the C++ kernel, or torch ops",
        cast(Callable[[str], Attention], _choice(get_args(Attention))), "cpp", "a row-wise attention")
    march: str = _var("SPECSTRUCT_MARCH", "the C++ kernels' `-march` (e.g. `x86-64-v3`, `x86-64-v3 -mavxvnni`)",
                      _text, "native", "an instruction set")
    log: LogLevel = _var("SPECSTRUCT_LOG", "`specstruct serve`'s log level (uvicorn's)",
                         cast(Callable[[str], LogLevel], _choice(get_args(LogLevel))), "warning", "a log level")
    api_key: str | None = _var("SPECSTRUCT_API_KEY", "the key `specstruct serve` requires (and `specstruct bench "
                               "serve` / `soak` send) when `--api-key` is not given", _secret, None, "a key",
                               "none (no key)")
    llama_server: str | None = _var("SPECSTRUCT_LLAMA_SERVER", "the llama-server binary of the llama.cpp benchmark "
                                    "baseline when `--llama-server` is not given", _text, None, "a path",
                                    "`llama-server` on PATH")
    jsonschemabench: Path | None = _var("SPECSTRUCT_JSONSCHEMABENCH", "a folder of JSONSchemaBench `*.json` schemas "
                                        "for the benchmarks", _path, None, "a path",
                                        "the subset under tests/data (in a checkout)")
    # the compile limits: unset, CompileLimits' own default (shown here; tests/unit/test_settings_env.py checks it)
    compile_time_s: float | None = _limit("SPECSTRUCT_COMPILE_TIME_S", float, "30 s",
                                          "wall time of one constraint compile")
    compile_memory_mb: int | None = _limit("SPECSTRUCT_COMPILE_MEMORY_MB", int, "4096 MB",
                                           "address space a compile's child may add")
    constraint_cache_mb: int | None = _limit("SPECSTRUCT_CONSTRAINT_CACHE_MB", int, "2048 MB",
                                             "compiled constraints kept in memory")
    disk_cache_mb: int | None = _limit("SPECSTRUCT_DISK_CACHE_MB", int, "4096 MB", "compiled indexes kept on disk")
    max_repeat: int | None = _limit("SPECSTRUCT_MAX_REPEAT", int, "10000", "largest counted repetition `{m,n}` in a "
                                    "regex")
    max_regex_size: int | None = _limit("SPECSTRUCT_MAX_REGEX_SIZE", int, "500000",
                                        "a regex's size with its counted repetitions expanded")
    max_schema_depth: int | None = _limit("SPECSTRUCT_MAX_SCHEMA_DEPTH", int, "128", "JSON nesting depth of a schema")
    max_schema_bytes: int | None = _limit("SPECSTRUCT_MAX_SCHEMA_BYTES", int, "4194304 bytes",
                                          "size of a JSON schema's text")
    lexer_fuel: int | None = _limit("SPECSTRUCT_LEXER_FUEL", int, "4000000",
                                    "llguidance lexer work allowed for one compile and for one token mask")
    mask_time_s: float | None = _limit("SPECSTRUCT_MASK_TIME_S", float, "5 s",
                                       "wall time of one call into a user's Lark grammar while generating")


VARIABLES: tuple[Variable, ...] = tuple(
    dataclasses.replace(cast(Variable, f.metadata["variable"]), field=f.name) for f in dataclasses.fields(Settings))
_BY_FIELD = {v.field: v for v in VARIABLES}

_ENVIRONMENT: Settings | None = None  # what the environment held at the first read (until cache_clear)
_OVERRIDES: dict[str, object] = {}   # the open `overridden` blocks' values
_CURRENT: Settings | None = None      # _ENVIRONMENT with _OVERRIDES


def read(environ: Mapping[str, str]) -> Settings:
    """The settings `environ` holds (unset and empty variables keep their defaults)."""
    changes: dict[str, object] = {}
    for v in VARIABLES:
        raw = environ.get(v.name, "")
        if raw.strip():
            changes[v.field] = _parsed(v, raw)
    return _with(Settings(), changes)


def _with(base: Settings, changes: dict[str, object]) -> Settings:
    """`base` with `changes`, each already parsed by its field's Variable (so of the field's type)."""
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]  # typed by the parsers, not statically


def _parsed(v: Variable, raw: str) -> object:
    try:
        return v.parse(raw)
    except ValueError as e:
        raise SettingsError(f"{v.name}={raw!r} is not {v.what}; use {e}, or unset it for the default "
                            f"({v.shown.replace('`', '')})") from None


def settings() -> Settings:
    """This process's settings: the environment as it was at the first call (or the first after `cache_clear()`),
    with the values of any open `overridden` block."""
    global _ENVIRONMENT, _CURRENT
    current = _CURRENT
    if current is None:
        if _ENVIRONMENT is None:
            _ENVIRONMENT = read(os.environ)
        current = _CURRENT = _with(_ENVIRONMENT, _OVERRIDES)
    return current


def cache_clear() -> None:
    """Forget what was read: the next `settings()` reads the environment again (tests that monkeypatch it). Open
    `overridden` blocks still apply."""
    global _ENVIRONMENT, _CURRENT
    _ENVIRONMENT = _CURRENT = None


@contextlib.contextmanager
def overridden(**values: object) -> Iterator[Settings]:
    """The settings with `values` (field names, e.g. `linear="onednn"`) inside the block, process-wide, then as
    before; each value is checked as the variable's text would be. The environment is left as it is."""
    global _OVERRIDES, _CURRENT
    changes: dict[str, object] = {}
    for name, value in values.items():
        v = _BY_FIELD.get(name)
        if v is None:
            raise SettingsError(f"no setting {name!r}; the settings are {sorted(_BY_FIELD)}")
        changes[name] = None if value is None else _parsed(v, str(value))
    before = _OVERRIDES
    _OVERRIDES, _CURRENT = {**before, **changes}, None
    try:
        yield settings()
    finally:
        _OVERRIDES, _CURRENT = before, None
