"""Another version of a kernel's source, built next to this tree's, so that both load in one process (the A/B
probes: blockq_ab, kernel_ab, attention_stream)."""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from specstruct.runtime import native


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"git {' '.join(args)}: {e.stderr.strip()}") from None


def show(commit: str, path: str) -> str:
    """A file of the repository at a commit."""
    return _git("show", f"{commit}:{path}")


def other_kernel(source: str, *, file: str | None = None, commit: str | None = None) -> Any:
    """The extension built from `file`, or from `source` (a path in the repository) at `commit` with the headers of
    its folder as of then; under a name of its own (the source's hash), so it loads beside this tree's build."""
    if commit:  # one folder per commit: the build's command names the path, so the same path is built once
        folder = Path(tempfile.gettempdir()) / f"specstruct_{Path(source).stem}_{_git('rev-parse', commit).strip()}"
        folder.mkdir(exist_ok=True)
        listed = _git("ls-tree", "--full-tree", "--name-only", commit, str(Path(source).parent) + "/").split()
        for header in (name for name in listed if name.endswith(".h")):  # the headers it includes, as of then
            (folder / Path(header).name).write_text(show(commit, header))
        path = folder / Path(source).name
        path.write_text(show(commit, source))
    elif file:
        path = Path(file)
    else:
        raise ValueError("give the other version: a file or a commit")
    key = hashlib.sha256(path.read_bytes()).hexdigest()[:12]  # built once per version, then cached
    other = native.Kernel(f"specstruct_other_{Path(source).stem}_{key}", path, f"another {Path(source).name}", "",
                          march="native")
    if other.load() is None:
        raise SystemExit(other.error)
    return other.module
