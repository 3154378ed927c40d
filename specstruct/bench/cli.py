"""`specstruct bench` / `python -m specstruct.bench`: the benchmark from the command line.

    specstruct bench --quick                       # quick look: spec vs target-only, 3 prompts each
    specstruct bench --scenario json --limit 10 --out results.json --plot bench.png
    specstruct bench --scenario batch --concurrency 1,2,4,8 --plot batch.png   # concurrent requests (batch_scenario.py)
    specstruct bench --scenario document --limit 3   # typed extraction from 1,000-3,000-token documents (documents.py)
    specstruct bench --scenario agent --limit 3      # a multi-turn tool-calling loop, turn by turn (agent.py)
"""

from __future__ import annotations

import sys
from typing import Any, Optional

import typer

from specstruct.bench.report import publish
from specstruct.bench.runner import ALL_BASELINES, DEFAULT_BASELINES, QUICK_LIMIT, run_benchmark
from specstruct.bench.workloads import DOCUMENT, SCENARIOS, extraction_workloads

app = typer.Typer(add_completion=False, rich_markup_mode="rich", context_settings={"help_option_names": ["-h", "--help"]},
                  help="Benchmark specstruct against target-only decoding, outlines and transformers generate on "
                  "JSON, code and prose workloads (and `specstruct bench serve`: load-test a running server).\n\n"
                  "Examples:\n\n"
                  "  specstruct bench --quick\n\n"
                  "  specstruct bench --scenario json --limit 8 --baselines specstruct,outlines,hf-assisted "
                  "--out json.json --plot bench.png\n\n"
                  "  specstruct bench --scenario batch --concurrency 1,2,4,8 --plot batch.png\n\n"
                  "  specstruct bench --scenario document --limit 3 --baselines specstruct,llama.cpp\n\n"
                  "  specstruct bench --scenario agent --limit 3 --baselines specstruct,llama.cpp\n\n"
                  "  specstruct bench serve --concurrency 1,4,8 --requests 16")

DEFAULT_MODEL, DEFAULT_DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"


def tiny_engine(**kwargs: Any) -> Any:
    """A random-weight tiny target + perturbed draft (seconds to build; for trying the pipeline, not speed)."""
    import specstruct as ss
    from specstruct.testing import perturbed, tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    target = tiny_model(tok, seed=0)
    return ss.SpecStruct(target, tok, draft_model=perturbed(target), model_name="tiny-random-qwen2", **kwargs)


def load_engine(model: str, draft: str | None, **kwargs: Any) -> Any:
    import specstruct as ss

    return ss.SpecStruct.from_pretrained(model, draft=draft, **kwargs)


def llama_side(model: str, binary: str | None, gguf: str | None) -> Any:
    """The llama.cpp side on the GGUF the engine's weights come from: --llama-gguf, the model itself when it is a
    .gguf file, or the registry model's file as it ships (assembled from its parts, SHA-256 checked)."""
    from pathlib import Path

    import torch

    from specstruct.bench.llama_cpp import LlamaCppSide, find_binary, registry_gguf
    from specstruct.settings import settings

    try:
        found = find_binary(binary)
    except FileNotFoundError as exc:
        raise typer.BadParameter(str(exc), param_hint="--llama-server") from None
    if gguf is None and model.endswith(".gguf"):
        gguf = model
    if gguf is None:
        from specstruct.models.registry import REGISTRY

        if model not in REGISTRY:
            raise typer.BadParameter(f"{model!r} is not a registry model: pass the GGUF file its weights come from",
                                     param_hint="--llama-gguf")
        cache = settings().cache / "gguf"
        gguf = str(registry_gguf(model, cache))
    if not Path(gguf).is_file():
        raise typer.BadParameter(f"no such file: {gguf}", param_hint="--llama-gguf")
    return LlamaCppSide(found, Path(gguf), threads=torch.get_num_threads())


def _progress_display() -> tuple[Any, Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    task = bar.add_task("warming up", total=None)

    def update(done: int, total: int, description: str) -> None:
        bar.update(task, completed=done, total=total, description=description)

    return bar, update


@app.callback(invoke_without_command=True)
def main(
    scenario: str = typer.Option("all", "--scenario", help="json | code | prose | all | document (typed extraction "
                                 "from 1,000-3,000-token documents) | agent (a multi-turn tool-calling loop: tool_choice "
                                 "'required' on the opening actions, then 'auto'; the same on every side) | "
                                 "pipeline | batch (concurrent extraction requests through the scheduler); the last "
                                 "four are not part of all"),
    concurrency: Optional[str] = typer.Option(None, "--concurrency", help="--scenario batch: requests arriving at "
                                              "once, comma-separated levels (default 1,2,4,8)"),
    limit: Optional[int] = typer.Option(None, "--limit", min=1,
                                        help="prompts per scenario (default: JSON 20 = 10 extraction + 10 "
                                             "JSONSchemaBench; code, prose 5; 3 with --quick)"),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", min=1,
                                                 help="default 128; --scenario document 512, agent 256"),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="0 = greedy (default)"),
    top_p: float = typer.Option(1.0, "--top-p"),
    seed: int = typer.Option(0, "--seed"),
    repeats: int = typer.Option(1, "--repeats", min=1, help="json, code, prose, document: run each prompt N times "
                                "per side, which side goes first alternating; each side keeps its median run (for "
                                "an even N the lower middle one): the machine's drift then moves both sides alike"),
    out: Optional[str] = typer.Option(None, "--out", help="write every per-prompt figure and the summary as JSON"),
    plot_path: Optional[str] = typer.Option(None, "--plot", help="write a PNG: speedup and acceptance per scenario"),
    quick: bool = typer.Option(False, "--quick", help="a few prompts per scenario, specstruct vs target-only only"),
    baselines: Optional[str] = typer.Option(None, "--baselines",
                                            help=f"comma-separated subset of {','.join(ALL_BASELINES)} "
                                                 "('specstruct' = specstruct with speculation off; default: all but "
                                                 "llama.cpp)"),
    llama_server: Optional[str] = typer.Option(None, "--llama-server",
                                               help="--baselines ...,llama.cpp: the llama-server binary (default: "
                                                    "env SPECSTRUCT_LLAMA_SERVER, else llama-server on PATH)"),
    llama_gguf: Optional[str] = typer.Option(None, "--llama-gguf", help="--baselines ...,llama.cpp: the GGUF file "
                                             "llama-server runs (default: the registry model's file as it ships, "
                                             "SHA-256 checked)"),
    model: str = typer.Option(DEFAULT_MODEL, "--model", help="target: registry name, hub id or folder"),
    draft: str = typer.Option(DEFAULT_DRAFT, "--draft", help="draft model ('none' for forced text + lookup only)"),
    run_tests: bool = typer.Option(False, "--run-tests", help="run HumanEval tests on every side's code (executes "
                                                              "model-written code in a subprocess)"),
    same_numerics: bool = typer.Option(False, "--same-numerics", help="run outlines/hf on specstruct's row-invariant "
                                                                      "numerics instead of transformers' stock ones"),
    quiet: bool = typer.Option(False, "--quiet", help="no progress bar"),
    from_results: Optional[str] = typer.Option(None, "--from-results", help="run nothing: re-render the table, "
                                               "--plot and --markdown from an earlier --out file"),
    markdown_out: Optional[str] = typer.Option(None, "--markdown", help="also write the table as Markdown "
                                               "(command, machine and numerics included)"),
    tiny: bool = typer.Option(False, "--tiny", hidden=True),
) -> None:
    """Run the benchmark and print the table (medians over prompts, with the spread)."""
    from rich.console import Console

    from specstruct.bench.measure import Settings
    from specstruct.bench.report import write_json

    console = Console() if sys.stdout.isatty() else Console(width=160)  # a wide table stays readable in logs
    max_new_tokens = max_new_tokens or {DOCUMENT: 512, "agent": 256}.get(scenario, 128)
    if from_results:
        import json
        from pathlib import Path

        from specstruct.bench.runner import resummarize

        publish(resummarize(json.loads(Path(from_results).read_text())), console, None, plot_path, markdown_out)
        return
    if repeats > 1 and scenario in ("batch", "pipeline", "agent"):
        raise typer.BadParameter(f"it repeats the prompts of json, code, prose and document, not of {scenario!r}",
                                 param_hint="--repeats")
    if concurrency is not None and scenario != "batch":
        raise typer.BadParameter(f"it sets the concurrent requests of --scenario batch, not of {scenario!r}",
                                 param_hint="--concurrency")
    if scenario == "batch":
        from specstruct.bench.batch_scenario import parse_concurrency, run_batch_cli

        concurrency = concurrency or "1,2,4,8"

        try:
            size = {"batch_config": {"max_batch_size": max(parse_concurrency(concurrency))}}
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--concurrency") from None
        with console.status("loading models"):
            engine = tiny_engine(**size) if tiny else load_engine(model, None if draft.lower() == "none" else draft,
                                                                  **size)
        settings = Settings(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed)
        run_batch_cli(engine, concurrency, settings, console, quiet=quiet, out=out, plot_path=plot_path,
                      markdown_out=markdown_out)
        return
    if scenario == "pipeline":  # prefix cache on vs off over one schema and ten passages
        from specstruct.bench.pipeline import main as pipeline

        ignored = [name for name, given in (("--plot", plot_path), ("--temperature", temperature)) if given]
        if ignored:
            raise typer.BadParameter(f"--scenario pipeline has no plot and decodes greedily; leave out "
                                     f"{', '.join(ignored)}", param_hint=ignored[0])
        extra = [b.strip() for b in (baselines or "").split(",") if b.strip()]
        if set(extra) - {"llama.cpp"}:
            raise typer.BadParameter(f"--scenario pipeline has its own sides (cached and cold specstruct, batched, "
                                     f"outlines); --baselines adds only llama.cpp, not {extra}",
                                     param_hint="--baselines")
        llama = llama_side(model, llama_server, llama_gguf) if extra else None

        with console.status("loading models"):
            engine = tiny_engine() if tiny else load_engine(model, None if draft.lower() == "none" else draft)
        pipeline(engine, console, limit, max_new_tokens, out, markdown_out,
                 None if quiet else lambda done, total, what: console.log(f"{done}/{total} {what}"),
                 others=not quick, llama=llama)  # --quick: in sequence only (no batched run, no outlines)
        return
    if scenario == "agent":  # a multi-turn tool-calling loop, turn by turn on every side (agent.py)
        from specstruct.bench.agent import main as agent

        if plot_path:
            raise typer.BadParameter("--scenario agent has no plot; leave out --plot", param_hint="--plot")
        chosen = [b.strip() for b in (baselines or "").split(",") if b.strip()]
        if set(chosen) - {"specstruct", "llama.cpp"}:
            raise typer.BadParameter(f"--scenario agent compares specstruct with its target alone ('specstruct') and "
                                     f"llama.cpp; not {sorted(set(chosen) - {'specstruct', 'llama.cpp'})}",
                                     param_hint="--baselines")
        llama = llama_side(model, llama_server, llama_gguf) if "llama.cpp" in chosen else None
        with console.status("loading models"):
            engine = tiny_engine() if tiny else load_engine(model, None if draft.lower() == "none" else draft)
        settings = Settings(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed)
        agent(engine, console, limit, settings, chosen, llama, out, markdown_out,
              None if quiet else lambda done, total, what: console.log(what))
        return
    scenarios = list(SCENARIOS) if scenario == "all" else [scenario]
    if any(s not in (*SCENARIOS, DOCUMENT) for s in scenarios):
        raise typer.BadParameter(f"unknown scenario {scenario!r}: use json, code, prose, all (those three), document, "
                                 "agent, pipeline or batch", param_hint="--scenario")
    chosen = [b.strip() for b in (baselines or ("specstruct" if quick else ",".join(DEFAULT_BASELINES))).split(",") if b.strip()]
    if unknown := [b for b in chosen if b not in ALL_BASELINES]:  # before minutes of model loading
        raise typer.BadParameter(f"unknown baseline(s) {unknown}: choose from {', '.join(ALL_BASELINES)}",
                                 param_hint="--baselines")
    limit = limit or (QUICK_LIMIT if quick else None)
    llama = llama_side(model, llama_server, llama_gguf) if "llama.cpp" in chosen else None  # before minutes of model loading: a missing binary is a usage error
    with console.status("loading models"):
        engine = tiny_engine() if tiny else load_engine(model, None if draft.lower() == "none" else draft)
    bar, update = (None, None) if quiet else _progress_display()
    settings = Settings(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
                        repeats=repeats)
    # --quick: JSON means typed extraction there (the full run mixes in JSONSchemaBench)
    fixed = {"json": extraction_workloads(limit)} if quick and "json" in scenarios else None
    kwargs = dict(scenarios=scenarios, limit=limit, baselines=chosen, settings=settings, run_tests=run_tests,
                  stock_baselines=not same_numerics, progress=update, workloads=fixed,
                  on_record=(lambda partial: write_json(partial, out)) if out else None, llama=llama)
    if bar is None:
        results = run_benchmark(engine, **kwargs)
    else:
        with bar:
            results = run_benchmark(engine, **kwargs)
    publish(results, console, out, plot_path, markdown_out)
