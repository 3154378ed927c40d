"""A step's masks as bitmask words against the bool masks they replaced, alternating step by step in one process.

    python -m benchmarks.mask_words_ab [--tokenizer qwen] [--k 8] [--steps 60] [--rounds 3]

For each constraint (a JSON schema through llguidance, a Lark grammar whose matcher lives in its child process, a
regex through outlines_core) it walks a real output and, at each committed position, builds the masks of the next
K+1 positions as a step does:

    bools  a fork of the constraint, advanced a candidate at a time, each position's bool [V] mask (llguidance's
           packed bytes unpacked with numpy, special ids cleared, EOS set where final: the former mask());
    words  spec.row's way now: the K+1 positions filled into one int32 [K+1, V/32] buffer (llguidance writes its
           words in place), walking the constraint itself and rolling it back.

`masks` times that alone; `+ consumers` adds what reads them each pass: the sparse head's panel plan and the greedy
verification of the K+1 positions (logits that accept every candidate, then a random last position whose argmax the
mask mostly refuses: the masked argmax). Its argmaxes over the vocabulary are the same on both sides and most of
its time: `masks` is the figure the words change. The two sides
alternate within each step (order swapped every step), medians over steps x rounds; the ratio is words / bools.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable

import numpy as np
import torch

from specstruct.bench.conformance_backends import load_tokenizer
from specstruct.constraints.base import ConstraintSpec, bitmask_words, fill_bitmasks
from specstruct.constraints.compiler import compile_constraint
from specstruct.constraints.llguidance.grammar import GrammarConstraint
from specstruct.runtime import sparse_head
from specstruct.spec.verify import verify_greedy

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"},
    "tags": {"type": "array", "items": {"type": "string"}}, "active": {"type": "boolean"}},
    "required": ["name", "age", "email", "tags", "active"]}
VALUE = {"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "tags": ["math", "engines", "poetry"],
         "active": True}
GRAMMAR = ('start: "SELECT " COLS " FROM " NAME (" WHERE " NAME " = " NUM)? ";"\n'
           'COLS: NAME (", " NAME)*\nNAME: /[a-z_]+/\nNUM: /[0-9]+/')
CASES = {  # name: (spec, an output it accepts)
    "json (llguidance)": (ConstraintSpec("json", json.dumps(SCHEMA)), json.dumps(VALUE)),
    "grammar (child)": (ConstraintSpec("grammar", GRAMMAR),
                        "SELECT name, age, email, created_at FROM users WHERE account_id = 123456;"),
    "regex (outlines)": (ConstraintSpec("regex", r"[A-Z][a-z]+ [A-Z][a-z]+, born (18|19|20)[0-9]{2} in [A-Z][a-z]+\."),
                         "Grace Hopper, born 1906 in Manhattan."),
}


def bool_mask(c: Any) -> torch.Tensor:
    """The bool mask as constraints computed it before the words (GrammarConstraint.mask() then; others' mask())."""
    if not isinstance(c, GrammarConstraint):
        return c.mask()
    if c._done() or c._m.is_stopped():
        bits = np.zeros(c.vocab_size, dtype=np.bool_)
    else:
        packed = np.frombuffer(c._m.compute_bitmask(), dtype=np.uint8)
        bits = np.unpackbits(packed, count=min(len(packed) * 8, c.vocab_size), bitorder="little")
        if len(bits) < c.vocab_size:
            bits = np.concatenate([bits, np.zeros(c.vocab_size - len(bits), dtype=np.uint8)])
        bits = bits.view(np.bool_)
        bits[c._special] = False
    bits[c._eos] = c.is_final()
    return torch.from_numpy(bits)


def bools(c: Any, cands: list[int]) -> list[torch.Tensor]:
    fork = c.fork()
    masks = [bool_mask(fork)]
    for t in cands:
        fork.advance([t])
        masks.append(bool_mask(fork))
    return masks


def words(c: Any, cands: list[int]) -> torch.Tensor:
    out = torch.empty(len(cands) + 1, bitmask_words(c.vocab_size), dtype=torch.int32)
    fill_bitmasks(c, cands, out)
    return out


def consume(masks: Any, logits: torch.Tensor, cands: list[int], vocab: int) -> None:
    sparse_head.plan(list(masks), vocab)
    verify_greedy(logits, list(masks), cands)


def run(c: Any, ids: list[int], k: int, steps: int, rounds: int, consumers: bool) -> tuple[float, float]:
    """(bools median s, words median s) per step."""
    times: dict[str, list[float]] = {"bools": [], "words": []}
    gen = torch.Generator().manual_seed(0)
    sides: dict[str, Callable[[Any, list[int]], Any]] = {"bools": bools, "words": words}
    for r in range(rounds + 1):  # the first round warms up (llguidance's lazy lexer states, the mask caches)
        walk = c.fork()
        for p in range(min(steps, len(ids) - 1)):
            cands = ids[p + 1 : p + 1 + k]
            logits = torch.randn(len(cands) + 1, c.vocab_size, generator=gen)
            logits[torch.arange(len(cands)), cands] = 10.0  # every candidate accepted
            order = ("bools", "words") if p % 2 == 0 else ("words", "bools")
            for side in order:
                t0 = time.perf_counter()
                masks = sides[side](walk, cands)
                if consumers:
                    consume(masks, logits, cands, c.vocab_size)
                if r:
                    times[side].append(time.perf_counter() - t0)
            assert walk.advance([ids[p + 1]]) == 1
    return statistics.median(times["bools"]), statistics.median(times["words"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default="qwen", choices=["qwen", "tiny"])
    ap.add_argument("--k", type=int, default=8, help="candidates per step (K+1 masks)")
    ap.add_argument("--steps", type=int, default=60, help="committed positions walked per round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    tok, vocab, eos = load_tokenizer(args.tokenizer)
    torch.set_num_threads(1)
    print(f"tokenizer {args.tokenizer} (vocab {vocab}), K+1 = {args.k + 1} masks per step, medians of "
          f"{args.rounds} x up to {args.steps} steps")
    print(f"{'constraint':<20} {'what':<12} {'bools ms':>9} {'words ms':>9} {'words/bools':>12}")
    for name, (spec, text) in CASES.items():
        c = compile_constraint(spec, tok, vocab_size=vocab, eos_token_ids=eos)
        ids = tok.encode(text, add_special_tokens=False)
        for consumers in (False, True):
            a, b = run(c, [ids[0]] + ids, args.k, args.steps, args.rounds, consumers)
            what = "+ consumers" if consumers else "masks"
            print(f"{name:<20} {what:<12} {a * 1e3:9.3f} {b * 1e3:9.3f} {b / a:12.2f}")


if __name__ == "__main__":
    main()
