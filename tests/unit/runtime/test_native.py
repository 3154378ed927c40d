"""Building the C++ kernels for another instruction set (SPECSTRUCT_MARCH): one this CPU cannot run is refused by
name before anything is built, instead of stopping the process with an illegal instruction."""

from __future__ import annotations

import pytest

from specstruct import settings
from specstruct.runtime import native


def test_an_instruction_set_this_cpu_lacks_is_refused_with_what_it_lacks(tmp_path, monkeypatch):
    missing = native.unsupported(["-march=sapphirerapids"])  # AMX, AVX512-FP16, ...: few CPUs have them all
    if not missing:
        pytest.skip("this CPU runs Sapphire Rapids code (or its features cannot be read here)")
    source = tmp_path / "probe.cpp"
    source.write_text("// never compiled\n")
    monkeypatch.setenv("SPECSTRUCT_MARCH", "sapphirerapids")
    settings.cache_clear()
    kernel = native.Kernel("specstruct_probe", source, "a probe kernel", "nothing to fall back to")
    assert kernel.load() is None
    assert "-march='sapphirerapids'" in kernel.error and missing[0] in kernel.error
    assert not list(tmp_path.glob("*.so"))


def test_this_cpus_own_instruction_set_and_x86_64_v1_are_accepted():
    assert native.unsupported(["-march=native"]) == []
    assert native.unsupported(["-march=x86-64"]) == []


def test_a_kernel_is_rebuilt_when_a_header_it_includes_changes(tmp_path):
    header, source = tmp_path / "math.h", tmp_path / "k.cpp"
    header.write_text("static inline float f(float x) { return x; }\n")
    source.write_text('#include <cmath>\n#include "math.h"\nfloat g(float x) { return f(x); }\n')
    before = native.cpu_key(source)
    header.write_text("static inline float f(float x) { return x + 1.0f; }\n")
    assert native.cpu_key(source) != before
