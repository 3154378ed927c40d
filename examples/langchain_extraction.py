"""LangChain extraction chain on a local model: prompt | ChatSpecStruct.with_structured_output(Model).

The schema is enforced while decoding (every reply is a valid `Company`, by construction), and the
grammar-forced JSON punctuation and keys are drafted for free, so speculation pays on every document.

    specstruct pull && pip install -e integrations/langchain
    python examples/langchain_extraction.py [--draft none]
"""

from __future__ import annotations

import argparse
import time

from langchain_core.prompts import ChatPromptTemplate
from pydantic import BaseModel, Field

from langchain_specstruct import ChatSpecStruct


class Company(BaseModel):
    """A company mentioned in a news snippet."""

    name: str = Field(description="company name as written")
    founded: int = Field(ge=1800, le=2030, description="year founded")
    headquarters: str = Field(description="city of the headquarters")
    industry: str


DOCUMENTS = [
    "Founded in 1976 in Los Altos, Apple moved its headquarters to Cupertino, where it still designs consumer "
    "electronics and software.",
    "Nintendo, the Kyoto video-game maker, began in 1889 as a producer of hanafuda playing cards.",
    "Spotify was started in Stockholm in 2006 and has grown into the largest music streaming service.",
    "The Dutch chip-equipment firm ASML, established in 1984, is based in Veldhoven.",
]

PROMPT = ChatPromptTemplate.from_messages([
    ("system", "You extract structured facts about companies. Use only facts stated in the text."),
    ("human", "Extract the company from this text:\n{text}"),
])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b", help="'none': only the free drafters")
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()

    llm = ChatSpecStruct(model=args.model, draft_model=None if args.draft == "none" else args.draft,
                         max_tokens=args.max_tokens)
    # include_raw keeps the AIMessage next to the parsed object: its metadata holds the speculative stats.
    chain = PROMPT | llm.with_structured_output(Company, include_raw=True)

    totals = {"tokens": 0, "forwards": 0, "drafted": 0, "accepted": 0, "seconds": 0.0}
    for text in DOCUMENTS:
        start = time.perf_counter()
        out = chain.invoke({"text": text})
        seconds = time.perf_counter() - start
        company, raw = out["parsed"], out["raw"]
        spec = raw.response_metadata["speculative"]
        print(repr(company) if company is not None else f"validation failed: {out['parsing_error']}")
        print(f"  {raw.usage_metadata['output_tokens']} tokens in {spec['target_forwards']} target passes "
              f"({spec['tokens_per_forward']:.2f} tokens/pass), acceptance {spec['acceptance_rate']:.0%}, "
              f"{seconds:.1f}s; per drafter: "
              + ", ".join(f"{k} {v['accepted']}/{v['proposed']}" for k, v in spec["per_drafter"].items()))
        totals["tokens"] += raw.usage_metadata["output_tokens"]
        totals["forwards"] += spec["target_forwards"]
        totals["drafted"] += spec["drafted"]
        totals["accepted"] += spec["accepted"]
        totals["seconds"] += seconds
    print(f"\n{len(DOCUMENTS)} documents: {totals['tokens']} tokens in {totals['forwards']} target passes "
          f"({totals['tokens'] / max(totals['forwards'], 1):.2f} tokens/pass), acceptance "
          f"{totals['accepted'] / max(totals['drafted'], 1):.0%}, {totals['seconds']:.1f}s on this machine")


if __name__ == "__main__":
    main()
