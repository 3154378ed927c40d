"""Code mode: free text that must parse as Python (checked with ast.parse; failures are retried with the
error fed back), with the draft model speculating up to 8 tokens a step.

    specstruct pull && python examples/code_mode.py
"""

from __future__ import annotations

import argparse

import specstruct as ss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    args = ap.parse_args()
    engine = ss.SpecStruct.from_pretrained(args.model, draft=None if args.draft == "none" else args.draft)
    res = engine.run("Write a Python function fizzbuzz(n) returning the FizzBuzz list for 1..n. Only code.",
                     ss.Code("python"), max_new_tokens=160)
    print(res.value)
    namespace: dict = {}
    exec(compile(res.value, "<generated>", "exec"), namespace)
    print("fizzbuzz(15)[-1] =", namespace["fizzbuzz"](15)[-1])
    s = res.stats
    print(f"{s.new_tokens} tokens in {s.target_forwards} target passes; draft acceptance "
          f"{s.per_drafter.get('model', ss.DrafterStats()).acceptance_rate:.0%}; k histogram {s.k_histogram}")


if __name__ == "__main__":
    main()
