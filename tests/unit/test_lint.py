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


# Ceilings on the escapes from the type checker, package-wide (the counts of the grep commands). Each sits a
# little above the count when it was set (`Any`: 843, getattr/hasattr: 165), for code landing in parallel; lower
# them as the counts fall, never raise them.
MAX_ANY = 850
MAX_GETATTR = 168


def _count(pattern: str) -> int:
    import re

    words = re.compile(pattern)
    return sum(len(words.findall(p.read_text())) for p in (ROOT / "specstruct").rglob("*.py"))


def test_any_and_getattr_do_not_grow():
    uses_any, reflection = _count(r"\bAny\b"), _count(r"\b(?:getattr|hasattr)\(")
    assert uses_any <= MAX_ANY, f"{uses_any} uses of Any (at most {MAX_ANY}): type the new code"
    assert reflection <= MAX_GETATTR, f"{reflection} getattr/hasattr calls (at most {MAX_GETATTR}): declare what you read"
