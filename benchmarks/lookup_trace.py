"""What prompt lookup's matches are worth, and how many passes the sparse LM head serves, on the bench prompts.

    python -m benchmarks.lookup_trace [--scenario json|code|prose] [--limit 8] [--max-new-tokens 128] [--min-match 4]
    python -m benchmarks.lookup_trace --steps [--scenario prose] [--limit 5]

Runs the scenario's prompts on the default pair (greedy, prefix cache off, speculation on, the draft model off)
and counts, per kind of match the lookup found (its length in characters, capped at 4; whether it holds a letter
or digit), how often the target accepted the first token it proposed; `--min-match 1` also lets the lookup propose
from the shorter matches it skips outside JSON. Then the share of target passes whose masks
let the LM head read only some of its panels (runtime/sparse_head.plan). Counts, not timings: they do not move
with the machine's load.

`--steps` instead runs the prompts as the bench's specstruct side does (the draft model on, the policy learning
from one prompt to the next, after the bench's warm-up) and prints per prompt what the policy did, in counts:
target passes by rows, candidates proposed and accepted by source (and how often a source's first token was
accepted), the draft model's steps and the context tokens it read before drafting, and the policy's verdict on the
draft model per step. Multiply by the per-row costs of `python -m benchmarks.step_cost --ks 1,2,3` for the expected
time of what it did against plain one-row steps.
"""

from __future__ import annotations

import argparse
import collections

from specstruct.bench.workloads import load_workloads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="json", choices=["json", "code", "prose"])
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--min-match", type=int, default=None, help="characters a match needs outside JSON")
    ap.add_argument("--steps", action="store_true", help="per prompt: passes by rows, candidates by source, draft reads")
    args = ap.parse_args()
    if args.steps:
        return steps(args.scenario, args.limit, args.max_new_tokens)

    import specstruct as ss
    from specstruct.runtime import sparse_head
    from specstruct.spec import row as rowmod
    from specstruct.spec.proposers import lookup

    if args.min_match is not None:
        lookup.MIN_MATCH = args.min_match
    engine = ss.SpecStruct.from_pretrained("qwen2.5-coder-1.5b", draft=None)
    matched: dict[str, str] = {}
    longest = lookup.longest_earlier

    def remember(text: str, limit: int = lookup.MAX_SUFFIX) -> tuple[int, int]:
        length, end = longest(text, limit)
        matched["last"] = text[len(text) - length :]
        return length, end

    lookup.longest_earlier = remember  # type: ignore[assignment]
    kinds: collections.Counter = collections.Counter()
    firsts: collections.Counter = collections.Counter()
    passes = {"all": 0, "sparse": 0}
    verify, plan = rowmod.Row.verify, sparse_head.plan

    def counted_plan(masks, vocab):
        chosen = plan(masks, vocab)
        if any(m is not None for m in masks):
            passes["all"] += 1
            passes["sparse"] += chosen is not None
        return chosen

    def judged(row, step, logits, masks):
        out = verify(row, step, logits, masks)
        at = 0
        for name, n in step.segments:
            if name == "lookup":
                m = matched.get("last", "")
                kind = f"{'letters/digits' if any(c.isalnum() for c in m) else 'punctuation'}, {min(len(m), 4)} chars"
                kinds[kind] += 1
                firsts[kind] += len(out) - 1 > at  # the target accepted the lookup's first token
            at += n
        return out

    sparse_head.plan = counted_plan  # type: ignore[assignment]
    rowmod.Row.verify = judged  # type: ignore[method-assign]
    cfg = ss.SpecConfig(max_retries=0, use_prefix_cache=False, use_draft_model=False)
    for w in load_workloads(args.scenario, args.limit):
        try:
            engine.run(w.messages, w.output_type, max_new_tokens=args.max_new_tokens, config=cfg)
        except ss.IncompleteOutputError:
            pass  # cut at max_new_tokens: its passes counted all the same
    print(f"{args.scenario}, {args.limit} prompts: lookup's first token accepted, by the match it came from")
    for kind in sorted(kinds):
        print(f"  {kind:30s} {firsts[kind]:4d} of {kinds[kind]:4d}")
    print(f"target passes whose LM head read only some panels: {passes['sparse']} of {passes['all']}")


def steps(scenario: str, limit: int, max_new_tokens: int) -> None:
    """What the policy did on each prompt, in counts (module docstring)."""
    import json

    import specstruct as ss
    from specstruct.spec import row as rowmod

    engine = ss.SpecStruct.from_pretrained("qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b")
    spec = engine.speculator
    count: dict[str, collections.Counter] = {}
    if spec.proposers.batched is not None:
        draft = spec.proposers.batched.runtime
        forward = draft.forward

        def counted(segments, keep, *a, **k):
            fed = sum(len(t) for _, t in segments)
            reads = fed > 2 * len(segments)  # more than the last accepted and the bonus token a row: context read
            if count:
                count["draft"]["read tokens" if reads else "steps"] += fed if reads else 1
            return forward(segments, keep, *a, **k)

        draft.forward = counted  # type: ignore[method-assign]
    verify, plan = rowmod.Row.verify, rowmod.Row._plan
    unread: dict[int, int] = {}  # row -> the context its draft lacked when it last planned (what the plan charged)

    def planning(row, alone=True):
        unread[id(row)] = row.draft_unread()
        return plan(row, alone)

    def judged(row, step, logits, masks):
        verdict = row.policy.model_verdict(row.constraint.mode, unread.get(id(row), 0))
        out = verify(row, step, logits, masks)
        if count:
            count["rows"][len(step.tokens) + 1] += 1
            count["verdict"][verdict] += 1
            accepted = len(out) - (0 if row.finished and row.finish_reason != "length" else 1)
            at = 0
            for name, n in step.segments:
                count["sources"][f"{name} proposed"] += n
                count["sources"][f"{name} first accepted"] += accepted > at
                count["sources"][f"{name} steps"] += 1
                count["sources"][f"{name} accepted"] += max(0, min(n, accepted - at))
                at += n
        return out

    rowmod.Row.verify = judged  # type: ignore[method-assign]
    rowmod.Row._plan = planning  # type: ignore[method-assign]
    cfg = engine.config.merged(max_retries=0, use_prefix_cache=False)
    for warm in (cfg.merged(enable_speculative=False), cfg):  # the bench's warm-up
        engine.run([{"role": "user", "content": "Say hello."}], None, max_new_tokens=3, config=warm)
    for w in load_workloads(scenario, limit):
        count.update(rows=collections.Counter(), sources=collections.Counter(), draft=collections.Counter(),
                     verdict=collections.Counter())
        try:
            st = engine.run(w.messages, w.output_type, max_new_tokens=max_new_tokens, config=cfg).stats
        except ss.IncompleteOutputError as exc:
            st = exc.stats
        print(json.dumps({"prompt": w.id, "tokens": st.new_tokens, "passes": st.target_forwards,
                          **{k: dict(sorted(v.items())) for k, v in count.items()}}), flush=True)
        count.clear()


if __name__ == "__main__":
    main()
