"""Random walks of compiled corpus schemas, checked against the ORIGINAL schema with `jsonschema`.

    python -m specstruct.bench.conformance_walks --keywords oneOf,if [--walks 8] [--tokens 120] [--limit N]

For every JSONSchemaBench schema whose text names one of `--keywords` and which compiles with the tiny tokenizer
(llguidance backend), walk the automaton from the start choosing random legal tokens (ending where the end is legal,
with probability 0.4, or when nothing else is), and validate each complete output against the schema as written
(the validator its `$schema` names; draft 2020-12 by default). A rewrite that widened the schema (a `not` or a
`oneOf` turned too loose) shows up as an output the schema rejects. Prints the counts and every such output.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def walk(constraint, eos: int, rnd: random.Random, tokens: int) -> list[int] | None:
    """The token ids of one random walk that reached a legal end within `tokens`, or None."""
    ids: list[int] = []
    for _ in range(tokens):
        legal = constraint.mask().nonzero().flatten().tolist()
        if eos in legal and (rnd.random() < 0.4 or len(legal) == 1):
            return ids
        choices = [t for t in legal if t != eos]
        if not choices:
            return None
        token = rnd.choice(choices)
        constraint.advance([token])
        ids.append(token)
    return None


def check_schema(path: Path, tok, walks: int, tokens: int) -> dict:
    """{"name", "status" (compiled / refused / error), "walks" (complete), "bad" [(output, ...)]} for one file."""
    import jsonschema

    from specstruct.constraints.base import ConstraintSpec
    from specstruct.constraints.compiler import compile_constraint
    from specstruct.errors import ConstraintError

    schema = json.loads(path.read_text())["schema"]
    out: dict = {"name": path.stem, "status": "compiled", "walks": 0, "bad": []}
    try:
        c = compile_constraint(ConstraintSpec("json", json.dumps(schema)), tok, vocab_size=408,
                               eos_token_ids=[tok.eos_token_id])
    except ConstraintError:
        out["status"] = "refused"
        return out
    check = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)(schema)
    rnd = random.Random(path.stem)
    for _ in range(walks):
        try:
            ids = walk(c.fork(), tok.eos_token_id, rnd, tokens)
        except ConstraintError as e:  # a typed error mid-walk (llguidance limits): counted, never unconstrained
            out["status"] = f"error while walking: {str(e)[:120]}"
            return out
        if ids is None:
            continue
        text = tok.decode(ids)
        out["walks"] += 1
        try:
            ok = check.is_valid(json.loads(text))
        except json.JSONDecodeError:
            ok = False
        if not ok:
            out["bad"].append(text[:300])
    return out


def main(argv: list[str] | None = None) -> int:
    from specstruct.bench.conformance import corpus_files
    from specstruct.testing import tiny_tokenizer

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keywords", default="oneOf,if", help="comma-separated keywords; a schema naming one is walked")
    p.add_argument("--walks", type=int, default=8)
    p.add_argument("--tokens", type=int, default=120, help="tokens per walk at most (tiny tokenizer)")
    p.add_argument("--limit", type=int, default=None, help="a deterministic sample of the corpus")
    args = p.parse_args(argv)
    keys = [f'"{k}"' for k in args.keywords.split(",")]
    files = [f for f in corpus_files(args.limit) if any(k in f.read_text() for k in keys)]
    tok, totals = tiny_tokenizer(), {"schemas": len(files), "compiled": 0, "walks": 0, "bad": 0, "errors": 0}
    for f in files:
        r = check_schema(f, tok, args.walks, args.tokens)
        totals["compiled"] += r["status"] != "refused"
        totals["errors"] += r["status"].startswith("error")
        totals["walks"] += r["walks"]
        totals["bad"] += len(r["bad"])
        for text in r["bad"]:
            print(f"{r['name']}: the original schema rejects {text}")
        if r["status"].startswith("error"):
            print(f"{r['name']}: {r['status']}")
    print(json.dumps(totals))
    return 1 if totals["bad"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
