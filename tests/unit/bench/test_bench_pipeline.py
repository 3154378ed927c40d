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


class FakeLlama:
    """Stands in for LlamaCppSide: records each /completion body and answers a fixed valid Person."""

    def __init__(self):
        self.bodies, self.closed = [], False

    def start(self):
        pass

    def close(self):
        self.closed = True

    def numerics(self):
        return "fake llama-server"

    def complete(self, body):
        from specstruct.bench.measure import Measurement

        self.bodies.append(body)
        text = '{"name": "Ada", "age": 36, "occupation": "mathematician", "city": "London", "email": null}'
        return Measurement(side="llama.cpp", text=text, token_ids=[1, 2, 3], new_tokens=3, elapsed_s=0.5,
                           times={"prefill_s": 0.1 if body["cache_prompt"] else 0.3})


def test_the_llama_cpp_pipeline_side_sends_the_same_prompts_cache_on_then_off(tok, target, tmp_path):
    import io

    from rich.console import Console

    import specstruct as ss
    from specstruct.bench.extraction import Person
    from specstruct.bench.pipeline import SYSTEM, main, pipeline_passages
    from specstruct.bench.pipeline_sides import messages_for

    engine, fake = ss.SpecStruct(target, tok), FakeLlama()
    res = main(engine, Console(file=io.StringIO(), width=200), 2, 8, None, str(tmp_path / "p.md"), None,
               others=False, llama=fake)
    assert [b["cache_prompt"] for b in fake.bodies] == [True, True, False, False] and fake.closed
    expected = [engine.prompt_ids(messages_for(SYSTEM, p), Person, max_new_tokens=8) for p in pipeline_passages(2)]
    assert [b["prompt"] for b in fake.bodies] == expected * 2  # the engine's exact prompt ids, both passes
    assert all(b["json_schema"] == Person.model_json_schema() and b["n_predict"] == 8 for b in fake.bodies)
    lc = res["llama.cpp"]
    assert lc["identical"] == 2 and lc["cache"]["valid"] == 2 and lc["cache"]["wall_s"] == 1.0
    text = (tmp_path / "p.md").read_text()
    assert "llama.cpp, prompt cache" in text and "| valid outputs | 2/2 | 2/2 |" in text


def test_the_pipeline_scenario_takes_only_llama_cpp_as_a_baseline():
    from typer.testing import CliRunner

    from specstruct.bench.cli import app

    result = CliRunner().invoke(app, ["--tiny", "--scenario", "pipeline", "--baselines", "outlines"])
    assert result.exit_code != 0 and "adds only llama.cpp" in result.output
