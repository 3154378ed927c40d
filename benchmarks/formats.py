"""GGUF files as people download them, side by side with llama.cpp: one row per file.

    python -m benchmarks.formats FILE.gguf [FILE.gguf ...] [--llama-bench PATH/llama-bench] [--cache 200]
                                 [--prefill 256] [--repeats 5]
    python -m benchmarks.formats --quantize Q5_K_M,Q3_K_M,IQ4_XS --llama-quantize PATH/llama-quantize
                                 [--source qwen2.5-coder-1.5b] [--out DIR] [--llama-bench PATH/llama-bench]

`--quantize` first writes each format from the source model's GGUF file with llama.cpp's own `llama-quantize
--allow-requantize` (the block layout users download; lossier than a file made from the original weights).

For each file, in a fresh process each (so the resident set is this file's alone):
- specstruct: `load_model(FILE)` (the bare file: config, tokenizer and weights from it) in seconds; the resident
  set after loading (VmRSS, MiB); one pass of 1 and of 9 new tokens at CACHE cached tokens (ms, median of
  REPEATS); a cold prefill of PREFILL tokens (tokens/s); the numerics string (which formats stayed in blocks, which
  kernel ran).
- llama.cpp: `llama-bench` on the same file and thread count: the same two passes (`-p K -n 0 -d CACHE`) and
  prefill (`-p PREFILL`); its process's peak resident set (MiB) and wall seconds for a one-pass run (load included).
Prints a Markdown table and the ratios (llama.cpp time / specstruct time: above 1 means specstruct is faster).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROW_KEYS = ("load_s", "rss_mib", "one_ms", "nine_ms", "prefill_tps")


def ours(path: str, cache: int, prefill: int, repeats: int) -> dict:
    """specstruct's figures for one file, in this process (call it in a fresh one)."""
    from benchmarks.load_memory import status_mib
    from benchmarks.step_cost import measure

    import torch

    from specstruct.runtime.gguf_model import load_model
    from specstruct.testing import OneSequence

    t0 = time.perf_counter()
    model, _ = load_model(path)
    load_s = time.perf_counter() - t0
    rss = status_mib().get("VmRSS", float("nan"))
    rt = OneSequence(model)
    ms = measure(rt, [1, 9], cache, prefill, repeats)
    return {"load_s": load_s, "rss_mib": rss, "one_ms": ms[f"1 tokens at {cache}"],
            "nine_ms": ms[f"9 tokens at {cache}"], "prefill_tps": prefill / ms[f"prefill {prefill}"] * 1e3,
            "numerics": rt.numerics, "threads": torch.get_num_threads()}


def theirs(binary: str, path: str, threads: int, cache: int, prefill: int, repeats: int) -> dict:
    """llama.cpp's figures for one file (llama-bench, same thread count)."""
    def bench(*args: str) -> float:
        out = subprocess.run([binary, "-m", path, "-t", str(threads), *args, "-o", "json"],
                             capture_output=True, text=True, check=True)
        return json.loads(out.stdout)[0]["avg_ns"] / 1e6

    with tempfile.NamedTemporaryFile("r") as stats:
        t0 = time.perf_counter()
        subprocess.run(["/usr/bin/time", "-o", stats.name, "-f", "%M", binary, "-m", path, "-t", str(threads),
                        "-p", "1", "-n", "0", "-r", "1", "-o", "json"], capture_output=True, check=True)
        load_s = time.perf_counter() - t0
        rss = int(stats.read().split()[-1]) / 1024
    one = bench("-p", "1", "-n", "0", "-d", str(cache), "-r", str(repeats))
    nine = bench("-p", "9", "-n", "0", "-d", str(cache), "-r", str(repeats))
    pre = bench("-p", str(prefill), "-n", "0", "-r", str(max(1, repeats // 2)))
    return {"load_s": load_s, "rss_mib": rss, "one_ms": one, "nine_ms": nine, "prefill_tps": prefill / pre * 1e3}


def quantize(tool: str, source: Path, kinds: list[str], out: Path) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for kind in kinds:
        target = out / f"{source.parent.name}-{kind}.gguf"
        if not target.exists():
            print(f"llama-quantize {kind} -> {target}", file=sys.stderr)
            subprocess.run([tool, "--allow-requantize", str(source), str(target), kind], check=True,
                           capture_output=True)
        files.append(str(target))
    return files


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", help="GGUF files to measure")
    ap.add_argument("--quantize", default="", help="formats to write with llama-quantize first, comma-separated")
    ap.add_argument("--llama-quantize", default=None, help="llama.cpp's llama-quantize binary (for --quantize)")
    ap.add_argument("--source", default="qwen2.5-coder-1.5b", help="the model --quantize starts from")
    ap.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "specstruct-formats"),
                    help="where --quantize writes its files")
    ap.add_argument("--llama-bench", default=None, help="llama.cpp's llama-bench binary: its side on each file")
    ap.add_argument("--cache", type=int, default=200)
    ap.add_argument("--prefill", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: measure one file in this process
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(ours(args.one, args.cache, args.prefill, args.repeats)))
        return
    files = list(args.files)
    if args.quantize:
        if not args.llama_quantize:
            ap.error("--quantize needs --llama-quantize PATH")
        from specstruct.models.loading import gguf_file, resolve

        files += quantize(args.llama_quantize, gguf_file(resolve(args.source)), args.quantize.split(","),
                          Path(args.out))
    if not files:
        ap.error("give GGUF files, or --quantize with --llama-quantize")
    rows = []
    for path in files:
        out = subprocess.run([sys.executable, "-m", "benchmarks.formats", "--one", path, "--cache", str(args.cache),
                              "--prefill", str(args.prefill), "--repeats", str(args.repeats)],
                             capture_output=True, text=True)
        if out.returncode:
            print(f"{path}: specstruct failed:\n{out.stderr[-2000:]}", file=sys.stderr)
            continue
        mine = json.loads(out.stdout.strip().splitlines()[-1])
        other = theirs(args.llama_bench, path, mine["threads"], args.cache, args.prefill, args.repeats) \
            if args.llama_bench else {}
        name = Path(path).name if Path(path).name != "model.gguf" else f"{Path(path).parent.name}/model.gguf"
        rows.append((name, Path(path).stat().st_size / 2**20, mine, other))
        print(f"{Path(path).name}: {mine['numerics']}", file=sys.stderr)
    head = ("| file | MiB | load s | RSS MiB | 1 token ms | 9 tokens ms | prefill tok/s | llama.cpp: load s | RSS MiB |"
            " 1 token ms | 9 tokens ms | prefill tok/s | 1 token x | 9 tokens x | prefill x |")
    print(f"\n{args.cache} cached tokens, prefill {args.prefill}, median of {args.repeats}; "
          "x = llama.cpp time / specstruct time")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for name, mib, mine, other in rows:
        cells = [name, f"{mib:.0f}", f"{mine['load_s']:.1f}", f"{mine['rss_mib']:.0f}", f"{mine['one_ms']:.1f}",
                 f"{mine['nine_ms']:.1f}", f"{mine['prefill_tps']:.0f}"]
        if other:
            cells += [f"{other['load_s']:.1f}", f"{other['rss_mib']:.0f}", f"{other['one_ms']:.1f}",
                      f"{other['nine_ms']:.1f}", f"{other['prefill_tps']:.0f}",
                      f"{other['one_ms'] / mine['one_ms']:.2f}", f"{other['nine_ms'] / mine['nine_ms']:.2f}",
                      f"{mine['prefill_tps'] / other['prefill_tps']:.2f}"]
        else:
            cells += [""] * 8
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
