"""Typed extraction: passages of text into validated Pydantic objects, with and without speculation.

    specstruct pull && python examples/extraction.py
"""

from __future__ import annotations

import argparse

from pydantic import BaseModel, Field

import specstruct as ss


class Person(BaseModel):
    name: str
    age: int = Field(ge=0, le=130)
    occupation: str
    city: str


PASSAGES = [
    "Grace Hopper was a computer scientist living in Arlington. She was 85 years old when she died, and is "
    "remembered for inventing the first compiler.",
    "At 36, Ada Lovelace, a mathematician from London, wrote what many call the first computer program.",
    "Linus Torvalds, a 54-year-old software engineer based in Portland, still maintains the Linux kernel.",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b", help="'none' to use only the free drafters")
    args = ap.parse_args()
    engine = ss.SpecStruct.from_pretrained(args.model, draft=None if args.draft == "none" else args.draft)
    print(f"numerics: {engine.numerics}")
    for text in PASSAGES:
        prompt = f"Extract the person from this text: {text}"
        plain = engine.run(prompt, Person, config=engine.config.merged(enable_speculative=False))
        fast = engine.run(prompt, Person)
        s, p = fast.stats, plain.stats
        assert fast.token_ids == plain.token_ids, "greedy speculation must not change the output"
        print(repr(fast.value))
        print(f"  {s.new_tokens} tokens: {s.target_forwards} target passes with speculation vs "
              f"{p.target_forwards} without; acceptance {s.acceptance_rate:.0%}; "
              f"{s.tokens_per_s:.2f} vs {p.tokens_per_s:.2f} tokens/s (this run, this machine)")
        print("  accepted per drafter:", {k: f"{v.accepted}/{v.proposed}" for k, v in s.per_drafter.items()})


if __name__ == "__main__":
    main()
