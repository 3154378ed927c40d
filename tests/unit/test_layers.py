"""The package's layers (pyproject.toml [tool.importlinter], docs/architecture.md) hold: each layer imports only
the layers below it. Runs import-linter's contract in-process, so CI checks it with the unit tests."""

from __future__ import annotations

from pathlib import Path

from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[2]


def test_layer_contract_is_kept():
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True) == 0


def test_every_module_is_in_a_layer():
    """The contract covers the whole package: a new top-level module or package must be given a layer."""
    import tomllib

    layers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]["layers"]
    named = {name.strip() for layer in layers for name in layer.replace("|", ":").split(":")}
    package = ROOT / "specstruct"
    present = {p.stem for p in package.glob("*.py") if not p.stem.startswith("__")}
    present |= {p.parent.name for p in package.glob("*/__init__.py")}
    assert present - named == set()
