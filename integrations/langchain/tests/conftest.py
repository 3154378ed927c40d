"""Make `langchain_specstruct` importable from a source checkout (no install needed to run the tests)."""

import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))
