"""What bounds the block-quantized kernel's AMX path: its schedule timed whole and in parts, on one thread.

    python -m benchmarks.amx_parts [--rows 256] [--inputs 1536] [--outputs 1536] [--repeats 9]

benchmarks/csrc/amx_parts.cpp is a standalone copy of the schedule of `amx_block` (specstruct/runtime/csrc/
blockq_linear.cpp) for one format (groups of 32 inputs, affine: Q4_K's), on random bytes: per group of 16 rows x
16 outputs x 32 inputs (a "group-block", 8,192 multiply-adds) two tile loads and one TDPBSUD, a tile store of the
16 x 16 sums, then 16 rows of float steps that scale them into the row accumulators (the steps that make the AMX
path's bits the vector path's). Each part is switched off in turn, so the lines say which part the time goes to and
whether the tile unit and the vector unit overlap (if they did, the whole would take about the larger part, not
their sum). A second schedule, 2 blocks of rows x 2 panels per group, shows what reusing each loaded tile for two
products buys when the accumulators (64 then) must live in memory. A third times the schedule llama.cpp's K-quant
numerics would allow (one activation scale per 256 inputs, the sub-scales applied to exact integer sums: a float step
per super-block, not per group), which the kernel does not use: it costs accuracy (docs/benchmarks.md).

Built with the machine's compiler (`-O3 -march=native`) into a temporary folder on each run (a second or two). On a
CPU that does not list AMX and AVX-512 it says so without building; where the OS does not grant the tile state,
the probe says so. Either way it exits 0 (nothing to measure is not an error).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "csrc" / "amx_parts.cpp"
NEEDS = ("avx512f", "amx_tile", "amx_int8")  # the flags /proc/cpuinfo must list for the probe to build and run


def build(out: Path) -> Path:
    """The probe compiled into `out`; SystemExit naming the problem where it cannot be."""
    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        raise SystemExit("no C++ compiler (g++, c++ or clang++) on PATH: the probe is C++")
    exe = out / "amx_parts"
    done = subprocess.run([cxx, "-O3", "-march=native", "-mamx-tile", "-mamx-int8", "-o", str(exe), str(SOURCE)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the probe did not build ({cxx}):\n{done.stderr.strip()}")
    return exe


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=256, help="rows of the product (a multiple of 32)")
    ap.add_argument("--inputs", type=int, default=1536, help="inputs (a multiple of 256)")
    ap.add_argument("--outputs", type=int, default=1536, help="outputs (a multiple of 32)")
    ap.add_argument("--repeats", type=int, default=9, help="timed runs per variant (median)")
    args = ap.parse_args(argv)
    from benchmarks.int8_peak import cpu_features

    missing = [f for f in NEEDS if f not in cpu_features()]
    if missing:
        print(f"this CPU does not list {', '.join(missing)}: the AMX path does not run here, nothing to measure")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(Path(tmp))
        done = subprocess.run([str(exe), str(args.rows), str(args.inputs), str(args.outputs), str(args.repeats)],
                              capture_output=True, text=True)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    return 0 if done.returncode in (0, 3) else done.returncode  # 3: AMX not granted, said on stdout


if __name__ == "__main__":
    raise SystemExit(main())
