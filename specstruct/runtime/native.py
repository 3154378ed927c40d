"""specstruct's C++ kernels (csrc/*.cpp), each built once per machine and loaded once per process.

A kernel is compiled by torch.utils.cpp_extension (a C++ compiler and ninja) with -march=native into torch's
extension cache, under a name keyed by the CPU's flags, torch's version and the source, so another machine, torch or
source builds its own. `SPECSTRUCT_MARCH` (e.g. "x86-64-v3": AVX2 without AVX-512; "x86-64-v3 -mavxvnni": with
AVX-VNNI) builds every kernel for another instruction set instead: a fleet's common one, or what a smaller machine
would run, measured here (read when a kernel is first built; one this CPU cannot run is refused by name).
Where it cannot be built its caller computes the same thing with torch ops, and `error`
says why (the numerics string names what runs).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from specstruct.settings import settings

log = logging.getLogger(__name__)
CFLAGS, LDFLAGS = ["-O3", "-march=native", "-fopenmp"], ["-fopenmp"]  # how every kernel is built (bench/kernel_ab too)
_STALE_LOCK_S = 600  # a build takes ~30 s; a lock older than this belongs to a build that was killed


def _source_text(source: Path) -> str:
    """The source and the local headers it includes (`#include "x.h"` beside it), as the compiler reads them."""
    text = source.read_text()
    headers = [line.split('"')[1] for line in text.splitlines() if line.startswith('#include "')]
    return text + "".join((source.parent / h).read_text() for h in headers)


def cpu_key(source: Path) -> str:
    """What a build depends on: the CPU's flags (-march=native), torch's version, the source and its headers."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        flags = platform.processor()
    text = "|".join([flags, _torch_version(), _source_text(source)])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@functools.lru_cache(maxsize=None)  # every kernel of a process is built with the same flags: asked once
def _features(flags: tuple[str, ...]) -> frozenset[str]:
    """The instruction-set feature macros the compiler defines for `flags` (__AVX2__, not __znver5__)."""
    # CXX is the build tools' variable, not a specstruct setting: read where torch's extension build reads it too
    out = subprocess.run([os.environ.get("CXX", "c++"), *flags, "-dM", "-E", "-x", "c++", "/dev/null"],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise OSError(out.stderr.strip()[:200])
    names = {m.split()[1] for m in out.stdout.splitlines() if m.startswith("#define __") and m.split()[2:] == ["1"]}
    return frozenset(n for n in names if n.endswith("__") and n.strip("_").isupper())


def unsupported(flags: list[str]) -> list[str]:
    """The instruction-set features compiler `flags` (-march=...) enable that this CPU lacks, by the compiler's own
    feature macros for them and for -march=native (its code would stop the process with an illegal instruction);
    [] where they all run here, or where the compiler cannot tell."""
    try:
        wanted = _features(tuple(flags))
        here = _features(tuple(["-march=native"] + [f for f in flags if not f.startswith("-m")]))  # same -O, -f
    except (OSError, subprocess.SubprocessError):
        return []
    return sorted(m.strip("_").lower() for m in wanted - here)


def _torch_version() -> str:
    import torch

    return torch.__version__


def prepare_build(directory: str, name: str, what: str) -> None:
    """Say so when a kernel is about to be compiled, and clear a lock left by a build that was killed (torch
    would wait on it forever)."""
    lock = Path(directory) / "lock"
    try:
        if lock.exists() and time.time() - lock.stat().st_mtime > _STALE_LOCK_S:
            lock.unlink()
    except OSError:
        pass
    if not (Path(directory) / f"{name}.so").exists():
        print(f"specstruct: building {what} (once per machine, about 30 s)...", file=sys.stderr)


class Kernel:
    """One C++ source: `load()` builds it on first use (once per process, whatever threads ask) and returns the
    extension module, or None after a failed build (then `error` says why, and the build is not retried)."""

    def __init__(self, stem: str, source: Path, what: str, fallback: str, march: str | None = None):
        self.stem, self.source, self.what, self.fallback = stem, source, what, fallback
        self._march = march
        self.module: object | None = None
        self.error: str | None = None
        self._lock = threading.Lock()
        self._variants: dict[str, Kernel] = {}  # march -> this source built for it (for_march)

    @property
    def march(self) -> str:
        """-march: this CPU's ("native"), another instruction set given (tests and probes compare the two), or
        setting SPECSTRUCT_MARCH's."""
        return self._march or settings().march

    def for_march(self, march: str) -> Any:
        """This source built for another instruction set (`-march`, e.g. "x86-64-v3": AVX2 without AVX-512;
        "x86-64": the portable path), to compare its bits and speed with this CPU's build (each built once);
        raises where it cannot be built."""
        with self._lock:
            variant = self._variants.setdefault(march, Kernel(self.stem, self.source, f"{self.what} ({march})", "",
                                                        march=march))
        ext = variant.load()
        if ext is None:
            raise RuntimeError(variant.error)
        return ext

    def load(self) -> Any:
        with self._lock:
            if self.module is None and self.error is None:
                self._build()
        return self.module

    def _build(self) -> None:
        target = self.march  # read before the try: a bad SPECSTRUCT_* value is the user's error, not a failed build
        try:
            from torch.utils import cpp_extension

            native = target == "native"
            tag = "".join(c if c.isalnum() else "_" for c in target)
            name = f"{self.stem}_{cpu_key(self.source)}" + ("" if native else f"_{tag}")
            march, *extra = target.split()  # "x86-64-v3 -mavxvnni": a -march and more -m flags
            flags = [f"-march={march}" if f == "-march=native" else f for f in CFLAGS] + extra
            missing = [] if native else unsupported(flags)
            if missing:
                raise RuntimeError(f"-march={target!r} (SPECSTRUCT_MARCH) uses {', '.join(missing)}, which this "
                                   "CPU lacks: name an instruction set it runs (e.g. x86-64-v3), or unset it")
            prepare_build(cpp_extension._get_build_directory(name, verbose=False), name, self.what)
            self.module = cpp_extension.load(name=name, sources=[str(self.source)], extra_cflags=flags,
                                             extra_ldflags=LDFLAGS, verbose=False)
        except Exception as e:  # no compiler or ninja, a failed build: the caller's torch path gives the same math
            self.error = f"{self.what} could not be built ({type(e).__name__}: {str(e).strip()[:200]})"
            log.warning("specstruct: %s; %s", self.error, self.fallback)
