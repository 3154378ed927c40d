"""benchmarks.amx_parts builds and runs: every variant's line where the CPU grants AMX, the reason where not."""

from __future__ import annotations

import shutil

import pytest

from benchmarks import amx_parts

needs_compiler = pytest.mark.skipif(not any(shutil.which(c) for c in ("g++", "c++", "clang++")),
                                    reason="no C++ compiler")


@needs_compiler
def test_the_probe_times_every_part_or_says_why_not(capsys):
    assert amx_parts.main(["--rows", "32", "--inputs", "256", "--outputs", "32", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    if "nothing to measure" in out:  # no AMX listed, or not granted
        return
    lines = [line for line in out.splitlines() if "ns per group-block" in line]
    assert len(lines) == 12 and lines[0].startswith("the kernel's schedule")
    assert any(line.startswith("K-quant numerics") for line in lines)


@needs_compiler
def test_bad_sizes_are_refused_by_name(capsys):
    code = amx_parts.main(["--rows", "30"])
    said = capsys.readouterr()
    if "nothing to measure" in said.out:
        pytest.skip("no AMX here: the probe does not build")
    assert code == 2 and "rows a multiple of 32" in said.err
