"""`specstruct bench --scenario pipeline` end to end on tiny models (the plumbing, not the speed): in sequence with
the prefix cache on and off, all passages batched with it on and off, and outlines on the same weights."""

from __future__ import annotations

import json


def test_cli_pipeline_scenario_on_tiny_models(tmp_path):
    from typer.testing import CliRunner

    from specstruct.bench.cli import app

    out, md = tmp_path / "p.json", tmp_path / "p.md"
    result = CliRunner().invoke(app, ["--tiny", "--scenario", "pipeline", "--limit", "2", "--max-new-tokens", "8",
                                      "--quiet", "--out", str(out), "--markdown", str(md)])
    assert result.exit_code == 0, result.output
    res = json.loads(out.read_text())
    assert res["summary"]["identical"] is True and len(res["calls"]) == 4
    assert any(c["cached_prompt_tokens"] > 0 for c in res["calls"] if c["cached"])
    batched = res["batched"]
    assert batched["identical"] is True and batched["cache"]["tokens"] > 0
    assert batched["cache"]["token_ids"] == [c["token_ids"] for c in res["calls"] if c["cached"]]  # batched == alone
    assert res["outlines"]["calls"] == 2 and res["outlines"]["tokens"] > 0
    text = md.read_text()
    assert "passages at once (batched)" in text and "outlines on the same weights" in text
