"""The SPECSTRUCT_* environment variables are read in one module, once (specstruct/settings.py): no other module reads
the environment for them, docs/settings.md's Environment table lists exactly its variables, a bad value is an error
naming the variable, and each variable still reaches what it sets."""

from __future__ import annotations

import ast
import dataclasses
import os
import re
from pathlib import Path

import pytest

from specstruct import settings
from specstruct.errors import SettingsError
from specstruct.settings import VARIABLES, Settings, overridden, read

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "settings.md"
SETTINGS_MODULE = ROOT / "specstruct" / "settings.py"

# Modules that read the environment for variables that are not specstruct's (each says why at the read)
OTHERS = {
    "specstruct/runtime/native.py": "CXX, the compiler the C++ build tools use",
    "specstruct/cli/ray.py": "RAY_ADDRESS, the Ray cluster to join",
    "specstruct/constraints/outlines/isolate.py": "a child process's environment (MALLOC_ARENA_MAX, RAYON_NUM_THREADS)",
    "specstruct/constraints/outlines/_index_worker.py": "RAYON_NUM_THREADS for outlines_core's thread pool",
}


def _reads_of_the_environment(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of each `os.environ`, `os.getenv`/`putenv`/`unsetenv`, `from os import environ` and click/typer
    `envvar=` in a module."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "environb", "getenv", "putenv", "unsetenv"):
            found.append((node.lineno, f"os.{node.attr}"))
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [(node.lineno, f"from os import {a.name}") for a in node.names if "env" in a.name]
        elif isinstance(node, ast.keyword) and node.arg in ("envvar", "auto_envvar_prefix"):
            found.append((node.value.lineno, f"{node.arg}="))
    return found


def _modules() -> list[Path]:
    return sorted(p for folder in ("specstruct", "benchmarks", "integrations") for p in (ROOT / folder).rglob("*.py"))


def test_no_module_but_settings_reads_the_environment_for_a_specstruct_variable():
    offenders = []
    for path in _modules():
        if path == SETTINGS_MODULE:
            continue
        name = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        lines = text.splitlines()
        for line, what in _reads_of_the_environment(ast.parse(text)):
            if name not in OTHERS or "SPECSTRUCT_" in lines[line - 1]:
                offenders.append(f"{name}:{line}: {what}: {lines[line - 1].strip()}")
    assert not offenders, ("read SPECSTRUCT_* settings through specstruct.settings.settings() (add the variable "
                           "there), or, for a variable that is not ours, add the module to OTHERS with why:\n"
                           + "\n".join(offenders))


def test_the_modules_allowed_to_read_other_variables_still_do_and_say_why():
    """An allowance no longer needed is removed; each read sits under a comment saying why it is not a setting."""
    for name in OTHERS:
        text = (ROOT / name).read_text()
        lines = text.splitlines()
        reads = _reads_of_the_environment(ast.parse(text))
        assert reads, f"{name} reads no environment any more: remove it from OTHERS"
        for line, _ in reads:
            above = lines[line - 2].strip()
            assert above.startswith("#") or "#" in lines[line - 1], f"{name}:{line}: say why in a comment"


def _doc_rows() -> list[str]:
    section = DOC.read_text().split("## Environment", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| `")]


def _rows() -> list[str]:
    return [f"| `{v.name}` | {v.shown} | {v.doc} |" for v in VARIABLES]


def test_the_docs_environment_table_is_exactly_the_settings_variables():
    assert _doc_rows() == _rows(), ("docs/settings.md's Environment table differs from specstruct/settings.py; its "
                                    "rows are:\n" + "\n".join(_rows()))


def test_the_compile_limit_defaults_shown_are_compile_limits_own():
    from specstruct.constraints.limits import _SETTING, CompileLimits

    shown = {v.field: v.shown for v in VARIABLES}
    for f in dataclasses.fields(CompileLimits):
        assert float(shown[_SETTING.get(f.name, f.name)].split()[0]) == getattr(CompileLimits(), f.name), f.name


def test_every_setting_is_one_variable_named_after_it():
    assert [v.field for v in VARIABLES] == [f.name for f in dataclasses.fields(Settings)]
    assert all(v.name == "SPECSTRUCT_" + v.field.upper() for v in VARIABLES), "a variable renamed: keep the old name"
    assert len({v.name for v in VARIABLES}) == len(VARIABLES) and all(v.doc for v in VARIABLES)


def test_unset_and_empty_variables_keep_their_defaults(monkeypatch):
    monkeypatch.setenv("HOME", "/home/someone")
    defaults = read({})
    assert read({v.name: " " for v in VARIABLES}) == defaults
    assert defaults.home == Path("/home/someone/.cache/specstruct/models")
    assert defaults.cache == Path("/home/someone/.cache/specstruct")
    assert (defaults.linear, defaults.attention, defaults.json_backend, defaults.march, defaults.log) == (
        "fixed", "cpp", "llguidance", "native", "warning")
    assert defaults.api_key is None and defaults.compile_time_s is None


def test_values_are_parsed_to_their_types():
    got = read({"SPECSTRUCT_LINEAR": " OneDNN ", "SPECSTRUCT_MAX_REPEAT": "1e3", "SPECSTRUCT_MASK_TIME_S": "2.5",
                "SPECSTRUCT_CACHE": "~/elsewhere", "SPECSTRUCT_MARCH": "x86-64-v3 -mavxvnni", "SPECSTRUCT_LOG": "INFO"})
    assert got.linear == "onednn" and got.max_repeat == 1000 and isinstance(got.max_repeat, int)
    assert got.mask_time_s == 2.5 and got.cache == Path("~/elsewhere").expanduser()
    assert got.march == "x86-64-v3 -mavxvnni" and got.log == "info"


@pytest.mark.parametrize("name, value, accepts", [
    ("SPECSTRUCT_LINEAR", "mkl", "is not a linear kernel; use one of ('fixed', 'onednn')"),
    ("SPECSTRUCT_ATTENTION", "flash", "is not a row-wise attention; use one of ('cpp', 'torch')"),
    ("SPECSTRUCT_JSON_BACKEND", "xgrammar", "is not a JSON backend; use one of ('llguidance', 'outlines')"),
    ("SPECSTRUCT_LOG", "loud", "is not a log level; use one of"),
    ("SPECSTRUCT_COMPILE_TIME_S", "soon", "is not a compile limit; use a number >= 0"),
    ("SPECSTRUCT_MAX_REPEAT", "-1", "is not a compile limit; use a number >= 0"),
    ("SPECSTRUCT_MASK_TIME_S", "inf", "is not a compile limit; use a number >= 0"),
])
def test_a_bad_value_names_the_variable_the_value_and_what_it_accepts(name, value, accepts):
    with pytest.raises(SettingsError, match=re.escape(f"{name}={value!r} {accepts}")) as e:
        read({name: value})
    assert "unset it for the default" in str(e.value) and isinstance(e.value, ValueError)


def test_the_environment_is_read_once_until_cache_clear(monkeypatch):
    monkeypatch.setenv("SPECSTRUCT_ATTENTION", "torch")
    settings.cache_clear()
    assert settings.settings().attention == "torch"
    monkeypatch.setenv("SPECSTRUCT_ATTENTION", "cpp")
    assert settings.settings().attention == "torch"  # read once
    settings.cache_clear()
    assert settings.settings().attention == "cpp"


def test_a_bad_value_stops_the_first_read_and_is_not_remembered(monkeypatch):
    monkeypatch.setenv("SPECSTRUCT_LINEAR", "mkl")
    settings.cache_clear()
    with pytest.raises(SettingsError, match="SPECSTRUCT_LINEAR='mkl'"):
        settings.settings()
    monkeypatch.setenv("SPECSTRUCT_LINEAR", "onednn")
    assert settings.settings().linear == "onednn"


def test_overridden_changes_a_block_and_never_the_environment(monkeypatch):
    monkeypatch.delenv("SPECSTRUCT_LINEAR", raising=False)
    settings.cache_clear()
    with overridden(linear="onednn", mask_time_s=1) as inside:
        assert inside.linear == settings.settings().linear == "onednn" and inside.mask_time_s == 1.0
        assert "SPECSTRUCT_LINEAR" not in os.environ
        settings.cache_clear()  # a test re-reading the environment inside the block keeps the block's values
        assert settings.settings().linear == "onednn"
        with overridden(linear="fixed"):
            assert settings.settings().linear == "fixed"
        assert settings.settings().linear == "onednn"
    assert settings.settings().linear == "fixed" and settings.settings().mask_time_s is None
    with pytest.raises(SettingsError, match="is not a linear kernel"), overridden(linear="mkl"):
        pass
    with pytest.raises(SettingsError, match="no setting 'kernel'"), overridden(kernel="fixed"):
        pass
    assert settings.settings().linear == "fixed"


def test_each_variable_reaches_what_it_sets(monkeypatch, tmp_path):
    from specstruct.constraints import compiler, limits
    from specstruct.constraints.cache import cache_dir
    from specstruct.models import bare_gguf, registry
    from specstruct.runtime import fixed_linear, native, packed
    from specstruct.runtime.kv.tiers import default_directory

    for name, value in {"SPECSTRUCT_CACHE": str(tmp_path / "c"), "SPECSTRUCT_HOME": "~/models",
                        "SPECSTRUCT_JSON_BACKEND": "outlines", "SPECSTRUCT_LINEAR": "onednn",
                        "SPECSTRUCT_ATTENTION": "torch", "SPECSTRUCT_MARCH": "x86-64-v3",
                        "SPECSTRUCT_COMPILE_TIME_S": "7", "SPECSTRUCT_CONSTRAINT_CACHE_MB": "12"}.items():
        monkeypatch.setenv(name, value)
    settings.cache_clear()
    assert cache_dir() == tmp_path / "c" / "constraints" and default_directory() == tmp_path / "c" / "kv"
    assert bare_gguf.cache_root() == tmp_path / "c" / "gguf-metadata"
    assert registry.home() == Path("~/models").expanduser()
    assert compiler.default_json_backend() == "outlines"
    assert fixed_linear.requested_kernel() == "onednn" and fixed_linear.why_not() == "SPECSTRUCT_LINEAR=onednn"
    assert packed.attention_kernel() == "torch"
    assert native.Kernel("probe", tmp_path / "p.cpp", "a probe", "").march == "x86-64-v3"
    assert native.Kernel("probe", tmp_path / "p.cpp", "a probe", "", march="native").march == "native"
    got = limits._from_settings()
    assert (got.time_s, got.cache_mb, got.memory_mb) == (7.0, 12, limits.CompileLimits().memory_mb)
    assert "the environment variable SPECSTRUCT_CONSTRAINT_CACHE_MB" in got.describe("cache_mb")


def test_the_command_line_turns_a_bad_value_into_a_usage_error(monkeypatch):
    from typer.testing import CliRunner

    from specstruct.cli import app

    monkeypatch.setenv("SPECSTRUCT_LOG", "loud")
    settings.cache_clear()
    result = CliRunner().invoke(app, ["serve", "--model", "unused", "--no-draft"])
    assert result.exit_code == 2, result.output
    assert "SPECSTRUCT_LOG='loud' is not a log level; use one of" in result.output
