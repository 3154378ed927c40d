"""`specstruct bench --scenario batch` end to end on a tiny engine (the pipeline, not the speed)."""

from __future__ import annotations

import json

import pytest

import specstruct as ss
from specstruct.bench.batch_scenario import parse_concurrency, run_batch_benchmark
from specstruct.bench.batch_report import batch_markdown
from specstruct.bench.measure import Settings


def test_batch_benchmark_reports_every_side_and_identical_outputs(tok, target, close_draft):
    with ss.SpecStruct(target, tok, draft_model=close_draft, batch_config={"max_batch_size": 2}) as e:
        res = run_batch_benchmark(e, [1, 2], settings=Settings(max_new_tokens=12))
    assert [lv["concurrency"] for lv in res["levels"]] == [1, 2]
    for lv in res["levels"]:
        assert set(lv["sides"]) == {"batched", "one-by-one", "no-spec", "hf-static"}
        assert lv["identical"] is True and set(lv["ratios"]) == {"one-by-one", "no-spec", "hf-static"}
        assert lv["sides"]["batched"]["tokens"] > 0 and lv["sides"]["batched"]["passes"] > 0
    json.dumps(res)
    assert "| 2 |" in batch_markdown(res)


def test_concurrency_levels_are_checked():
    assert parse_concurrency("1,2, 8") == [1, 2, 8]
    for bad in ("", "0,2", "a"):
        with pytest.raises(ValueError, match="--concurrency"):
            parse_concurrency(bad)


def test_cli_batch_scenario_on_tiny_models(tmp_path):
    from typer.testing import CliRunner

    from specstruct.bench.cli import app

    out, md = tmp_path / "b.json", tmp_path / "b.md"
    result = CliRunner().invoke(app, ["--tiny", "--scenario", "batch", "--concurrency", "1,2", "--max-new-tokens",
                                      "6", "--quiet", "--out", str(out), "--markdown", str(md)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert [lv["concurrency"] for lv in data["levels"]] == [1, 2] and data["meta"]["batch_config"]["max_batch_size"] == 2
    assert "x one-by-one" in md.read_text()
    bad = CliRunner().invoke(app, ["--tiny", "--scenario", "batch", "--concurrency", "0"])
    assert bad.exit_code != 0 and "--concurrency" in bad.output
