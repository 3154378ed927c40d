"""Plumbing of the `specstruct` CLI: exit codes, one-line errors, output types from options, printing.

Kept apart from the commands (specstruct/cli/commands.py) so each file stays short; nothing here imports torch."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterator, Optional

import typer

EXIT_OK, EXIT_OTHER, EXIT_USAGE, EXIT_CONSTRAINT, EXIT_MODEL_MISSING, EXIT_INCOMPLETE = 0, 1, 2, 3, 4, 5
EXIT_CODES = """[bold]Exit codes[/bold]

  0  ok
  1  other error
  2  usage: bad option or input file, incompatible draft, prompt too long
  3  constraint error: the schema, regex or grammar cannot be compiled
  4  model missing: run `specstruct pull` (or fix --model/--draft)
  5  incomplete output or validation failure: raise --max-new-tokens"""


state = {"debug": False}


def fail(message: str, code: int) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def exit_code(exc: BaseException) -> int:
    from specstruct import errors as e

    table = [
        (e.ConstraintError, EXIT_CONSTRAINT),
        (e.ModelNotFoundError, EXIT_MODEL_MISSING),
        ((e.IncompleteOutputError, e.ValidationRetryError), EXIT_INCOMPLETE),
        ((e.IncompatibleDraftError, e.PromptTooLongError, e.KVMemoryError, e.InvalidParameterError,
          e.InvalidPromptError, e.SettingsError), EXIT_USAGE),
    ]
    for kinds, code in table:
        if isinstance(exc, kinds):
            return code
    return EXIT_OTHER


def ray_cause(exc: BaseException) -> BaseException:
    """The error a Ray wrapper carries (RayTaskError, UserCodeException, ActorDiedError: `.cause` or `__cause__`),
    so the CLI names specstruct's message and exit code rather than Ray's traceback."""
    seen: set[int] = set()
    while type(exc).__module__.startswith("ray") and id(exc) not in seen:
        seen.add(id(exc))
        inner = getattr(exc, "cause", None)
        inner = inner if isinstance(inner, BaseException) else exc.__cause__
        if not isinstance(inner, BaseException):
            break
        exc = inner
    return exc


@contextlib.contextmanager
def errors() -> Iterator[None]:
    """Turn any exception into one `error: ...` line on stderr and the documented exit code."""
    try:
        yield
    except (typer.Exit, typer.Abort, SystemExit):
        raise
    except KeyboardInterrupt:
        raise fail("interrupted", 130) from None
    except BrokenPipeError:  # stdout closed early (`| head`): stop quietly, as other command-line tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(EXIT_OTHER) from None
    except Exception as exc:  # noqa: BLE001 - the CLI boundary
        if state["debug"]:
            raise
        from specstruct.extras import as_missing_extra

        exc = as_missing_extra(ray_cause(exc)) or ray_cause(exc)
        message = " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__
        if len(message) > 600:
            message = message[:600] + " ..."
        raise fail(message, exit_code(exc)) from None


# ---------------------------------------------------------------- output types from options

def read_text(path: str, what: str) -> str:
    if path == "-":
        try:
            return sys.stdin.read()
        except UnicodeDecodeError as exc:
            raise fail(f"{what} from standard input: not UTF-8 text ({exc.reason} at byte {exc.start})",
                       EXIT_USAGE) from None
    p = Path(path)
    if p.is_dir():
        raise fail(f"{what} {path!r} is a folder; give a file", EXIT_USAGE)
    if not p.is_file():
        raise fail(f"{what} file {path!r} not found", EXIT_USAGE)
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise fail(f"{what} {path}: not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8",
                   EXIT_USAGE) from None


def load_schema(path: str) -> dict[str, Any]:
    try:
        schema = json.loads(read_text(path, "--schema"))
    except json.JSONDecodeError as exc:
        raise fail(f"--schema {path}: not valid JSON ({exc})", EXIT_USAGE) from None
    except RecursionError:
        raise fail(f"--schema {path}: nested too deeply to read", EXIT_USAGE) from None
    if not isinstance(schema, dict):
        raise fail(f"--schema {path}: a JSON schema must be an object, got {type(schema).__name__}", EXIT_USAGE)
    return schema


def load_pydantic(ref: str) -> Any:
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise fail(f"--pydantic expects module:Class (e.g. myapp.models:Person), got {ref!r}", EXIT_USAGE)
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise fail(f"--pydantic {ref}: cannot import ({exc})", EXIT_USAGE) from None
    return obj


def output_type_from_options(schema: Optional[str], pydantic: Optional[str], regex: Optional[str],
                             choice: Optional[str], grammar: Optional[str], code: Optional[str]) -> Any:
    """Map the mutually exclusive output options to one output type (None = free text)."""
    given = {k: v for k, v in dict(schema=schema, pydantic=pydantic, regex=regex, choice=choice,
                                   grammar=grammar, code=code).items() if v is not None}
    if len(given) > 1:
        raise fail(f"choose one output option, got {', '.join('--' + k for k in given)}", EXIT_USAGE)
    if not given:
        return None
    import specstruct as ss

    if schema is not None:
        return load_schema(schema)
    if pydantic is not None:
        return load_pydantic(pydantic)
    if regex is not None:
        return ss.Regex(regex)
    if choice is not None:
        options = [c.strip() for c in choice.split(",") if c.strip()]
        if not options:
            raise fail("--choice needs at least one option, e.g. --choice yes,no", EXIT_USAGE)
        return ss.Choice(options)
    if grammar is not None:
        return ss.Grammar(read_text(grammar, "--grammar"))
    return ss.Code(code)


def render_value(result: Any) -> str:
    """What goes to stdout: the output as written, which is what the schema or constraint guarantees (and what
    --stream prints). Re-serializing the parsed value would change it: field names instead of aliases, an
    out-of-range number as null."""
    return result.text


def fields(obj: Any) -> dict[str, Any]:
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if hasattr(obj, "model_dump"):
        return obj.model_dump()
    if hasattr(obj, "__dataclass_fields__"):
        return {k: getattr(obj, k) for k in obj.__dataclass_fields__}
    return dict(obj) if isinstance(obj, dict) else dict(vars(obj))


def print_stats(stats: Any) -> None:
    """Stats as rich tables on stderr: the totals, then per-drafter acceptance and the k histogram."""
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True)
    data = fields(stats)
    per_drafter, hist = data.pop("per_drafter", None) or {}, data.pop("k_histogram", None) or {}
    table = Table(title="stats", show_header=False)
    for key, value in data.items():
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    console.print(table)
    if per_drafter:
        t = Table("drafter", "proposed", "accepted", "acceptance", title="per drafter")
        for name, d in per_drafter.items():
            d = fields(d)
            t.add_row(name, str(d.get("proposed")), str(d.get("accepted")), f"{d.get('acceptance_rate', 0):.2%}")
        console.print(t)
    if hist:
        t = Table("k (candidates per step)", "steps", title="k histogram")
        for k in sorted(hist):
            t.add_row(str(k), str(hist[k]))
        console.print(t)
