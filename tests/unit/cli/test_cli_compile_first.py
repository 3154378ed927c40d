"""The CLI checks the output option before loading any model: a typo in --regex or
--grammar exits 3 at once instead of after a full model load."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specstruct.cli import commands as cli


@pytest.fixture
def loads(monkeypatch):
    calls = []

    def engine(*args, **kwargs):
        calls.append(args)
        raise AssertionError("the model was loaded before the constraint was checked")

    monkeypatch.setattr(cli, "_engine", engine)
    return calls


@pytest.mark.parametrize("option, value", [("--regex", "a)|(b"), ("--regex", "[0-9"), ("--choice", "a\x00b,c")])
def test_a_bad_constraint_exits_3_before_any_model_loads(loads, option, value):
    result = CliRunner().invoke(cli.app, ["generate", "hi", option, value])
    assert result.exit_code == 3, result.output
    assert loads == []


def test_a_bad_grammar_or_schema_exits_3_before_any_model_loads(loads, tmp_path):
    grammar = tmp_path / "g.lark"
    grammar.write_text("start: undefined_rule\n")
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"a": {"type": "string", "not": {"pattern": "^x"}}}}))
    assert CliRunner().invoke(cli.app, ["generate", "hi", "--grammar", str(grammar)]).exit_code == 3
    assert CliRunner().invoke(cli.app, ["extract", "--schema", str(schema), "--text", "-"], input="x").exit_code == 3
    assert loads == []


def test_a_schema_whose_check_runs_past_the_time_limit_exits_3_at_it(loads, tmp_path, monkeypatch):
    """The check before the model loads is a compile like any other: bounded by the compile limits, ended at
    `time_s` with one line naming the limit."""
    import time

    from specstruct.constraints import limits as L
    from specstruct.constraints.llguidance import json_schema

    real = json_schema._grammar

    def slow(*args, **kwargs):
        time.sleep(30)
        return real(*args, **kwargs)

    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}}))
    monkeypatch.setattr(json_schema, "_grammar", slow)
    monkeypatch.setattr(L, "_LIMITS", L.limits())
    L.set_limits(time_s=1.0)
    start = time.monotonic()
    result = CliRunner().invoke(cli.app, ["extract", "--schema", str(schema), "--text", "-"], input="x")
    assert time.monotonic() - start < 2.0
    assert result.exit_code == 3, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "limit time_s=1.0" in lines[0], result.output
    assert loads == []
