"""The package's layers (pyproject.toml [tool.importlinter], docs/architecture.md) hold: each layer imports only
the layers below it. Runs import-linter's contract in-process, so CI checks it with the unit tests."""

from __future__ import annotations

from pathlib import Path

from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[2]


def test_layer_contract_is_kept():
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True) == 0
