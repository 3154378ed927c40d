"""ruff finds nothing in the package, the integration, the probes or the tests; mypy (strict) nothing in the seams
([tool.ruff] and [tool.mypy] in pyproject.toml)."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_is_clean():
    ruff = shutil.which("ruff") or (Path(sys.executable).parent / "ruff")
    assert Path(ruff).exists(), "ruff is not installed: pip install -e '.[test]' (it is a test dependency)"
    done = subprocess.run([str(ruff), "check", "specstruct", "integrations", "benchmarks", "tests"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_is_clean_at_the_seams():
    mypy = shutil.which("mypy") or (Path(sys.executable).parent / "mypy")
    assert Path(mypy).exists(), "mypy is not installed: pip install -e '.[test]' (it is a test dependency)"
    done = subprocess.run([str(mypy)], cwd=ROOT, capture_output=True, text=True)  # the files of [tool.mypy]
    assert done.returncode == 0, done.stdout + done.stderr
