"""Regex, choice, Literal and Enum outputs: the answer always has the shape you asked for.

    specstruct pull && python examples/regex_and_choice.py
"""

from __future__ import annotations

import argparse
from enum import Enum
from typing import Literal

import specstruct as ss


class Priority(str, Enum):
    low = "low"
    medium = "medium"
    high = "high"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    args = ap.parse_args()
    engine = ss.SpecStruct.from_pretrained(args.model, draft=None if args.draft == "none" else args.draft)

    review = "The battery died after two days and support never answered. Avoid."
    print("sentiment:", engine.generate(f"Sentiment of this review: {review}", ss.Choice(["positive", "negative", "neutral"])))
    print("priority :", engine.generate(f"Ticket priority for: 'Production database is down'", Priority))
    print("yes/no   :", engine.generate("Is 17 a prime number?", Literal["yes", "no"]))
    print("date     :", engine.generate("When did Apollo 11 land on the Moon? Answer as YYYY-MM-DD.",
                                        ss.Regex(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")))
    print("phone    :", engine.generate("Make up a US phone number.", ss.Regex(r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}")))
    print("integer  :", engine.generate("How many legs does a spider have?", int))


if __name__ == "__main__":
    main()
