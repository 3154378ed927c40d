"""docs/architecture.md's request walk names only functions that exist: every dotted name in its "One request"
section is imported here, so a rename that leaves the doc behind fails this test."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def _walk() -> str:
    text = DOC.read_text()
    start = text.index("## One request")
    return text[start : text.index("\n## ", start + 1)]


def _resolve(dotted: str) -> object:
    """`a.b.C.meth` -> the object, importing the longest module prefix under specstruct."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module("specstruct." + ".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise AssertionError(f"{dotted}: no such module under specstruct")


def test_the_request_walk_names_only_what_exists():
    names = re.findall(r"`([a-z_]+(?:\.[A-Za-z_]+)+)`", _walk())
    qualified = [n for n in names if n.split(".")[0] in {"api", "types", "engine", "spec", "runtime", "constraints"}]
    assert len(qualified) >= 10
    for name in qualified:
        assert _resolve(name) is not None, name


def test_short_names_in_the_walk_belong_to_classes_it_named():
    """`Class.method` written after the class was named in full resolves on that class."""
    walk = _walk()
    classes = {n.split(".")[-1]: _resolve(n) for n in re.findall(r"`([a-z_]+(?:\.[a-z_]+)+\.[A-Z]\w+)", walk)}
    for cls, meth in re.findall(r"`([A-Z]\w+)\.(\w+)`", walk):
        if cls in classes:
            assert hasattr(classes[cls], meth), f"{cls}.{meth}"
