"""`specstruct --help` and `import specstruct` stay cheap: no torch."""

from __future__ import annotations

import subprocess
import sys

import specstruct as ss

PROBE = """
import sys
from typer.testing import CliRunner
{setup}
heavy = sorted(m for m in ("torch", "transformers", "outlines", "langchain_core") if m in sys.modules)
print(",".join(heavy) or "none")
"""


def _heavy_after(setup: str) -> str:
    out = subprocess.run([sys.executable, "-c", PROBE.format(setup=setup)], capture_output=True, text=True,
                         timeout=120, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_cli_help_imports_no_torch():
    setup = ("from specstruct.cli import app\n"
             "r = CliRunner().invoke(app, ['--help'])\nassert r.exit_code == 0 and 'Exit codes' in r.output")
    assert _heavy_after(setup) == "none"


def test_import_specstruct_imports_no_torch():
    assert _heavy_after("import specstruct") == "none"


def test_every_public_name_resolves():
    for name in ss.__all__:
        assert getattr(ss, name) is not None
    assert ss.models.pull is ss.pull
