"""benchmarks.amx_parts builds and runs: every variant's line where the CPU grants AMX, the reason where not."""

from __future__ import annotations

import pytest

from benchmarks import amx_parts


def run(*argv: str) -> int:
    """The probe's exit code; skipped where it cannot be built here (no compiler, not x86)."""
    try:
        return amx_parts.main(list(argv))
    except SystemExit as exc:
        pytest.skip(str(exc))


def test_the_probe_times_every_part_or_says_amx_is_not_granted(capsys):
    assert run("--rows", "32", "--inputs", "128", "--outputs", "32", "--repeats", "1") == 0
    out = capsys.readouterr().out
    if "AMX not granted" in out:
        return
    lines = [line for line in out.splitlines() if "ns per group-block" in line]
    assert len(lines) == 9 and lines[0].startswith("the kernel's schedule")


def test_bad_sizes_are_refused_by_name(capsys):
    assert run("--rows", "30") == 2
    assert "rows a multiple of 32" in capsys.readouterr().err
