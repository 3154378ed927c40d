"""`python -m benchmarks.draft_agreement [int8|float32] [prompts]`: does the draft model agree with the target
inside the engine as often as it does teacher-forced?

For typed-extraction prompts it decodes speculatively while logging every draft-model proposal and every step's
segments, then runs one teacher-forced pass of prompt + output through each model and compares, per position:
the draft's masked argmax (teacher-forced) with the target's output, and each in-engine draft token with the
teacher-forced draft argmax at the same position (equal when the draft's cache is in step). Draft tokens
proposed after an off-path context (a wrong lookup or forced span earlier in the same step) are counted apart.
Teacher-forced, it also counts the positions where the target's token is among the draft's 2 and 4 best (`tf_top2`,
`tf_top4`), and prints how many draft tokens a step would keep on average with a tree of the draft's best b
candidates at every level, d levels deep (b = 1: a chain of d draft tokens): the run of positions from each one on
where the target's token is among the draft's best b, capped at d. `--scenario prose` runs the bench's
prose prompts (free text, where the policy rarely drafts with the model: the in-engine counts are then empty);
`--head-tokens N` computes the draft's head over the first N token ids only (EngineConfig.draft_head_tokens).
"""

from __future__ import annotations

import collections
from contextlib import nullcontext

import torch
from specstruct.runtime.draft_head import HeadRestricted, restricted
from specstruct.testing import run_alone


BRANCHES, DEPTHS = (1, 2, 4), (1, 2, 3, 4)  # the draft trees whose accepted lengths are counted (b = 1: a chain)


def _masks(constraint, out):
    f, masks = constraint.fork(), []
    for t in out:
        masks.append(f.mask().clone())
        f.advance([t])
    return masks


def analyse(eng, w, max_new_tokens: int = 200) -> collections.Counter:
    from specstruct.spec.proposers import draft_model as batch_module  # the draft's propose_batch runs run_drafts

    drafter = eng.speculator.drafters["model"]
    props: list[tuple[list[int], list[int]]] = []
    inner = batch_module.run_drafts

    def logged(runtime, jobs, eos, costs):  # what the draft proposed: the hint prefix it kept, then its own tokens
        inner(runtime, jobs, eos, costs)
        props.extend((list(j.context), j.hint[: j.hint_kept] + list(j.tokens)) for j in jobs if not j.feed_only)

    batch_module.run_drafts = logged
    try:
        ids = eng.prompt_ids(w.messages, w.output_type, max_new_tokens=max_new_tokens)
        c = eng.constraint(w.output_type)
        dec = run_alone(eng.speculator.row(ids, c.fork(), eng.config.merged(max_new_tokens=max_new_tokens)))
    finally:
        batch_module.run_drafts = inner
    out, P = dec.token_ids, len(ids)
    masks = _masks(c, out)
    rt = drafter.runtime  # a restricted head computes its first token ids only, as when the draft drafts
    with torch.inference_mode(), restricted(rt.head, rt.tokens) if isinstance(rt, HeadRestricted) else nullcontext():
        seq = torch.tensor([ids + out])
        dl = rt.model(input_ids=seq).logits[0].float()
    V = masks[0].shape[0]
    legal = [dl[P + i - 1, :V].masked_fill(~masks[i], float("-inf")) for i in range(len(out))]
    tf = [int(torch.argmax(row)) for row in legal]
    best = [torch.topk(row, 4).indices.tolist() for row in legal]
    # where fewer than 4 tokens are legal, topk's tail is arbitrary -inf ones: the target's counts only if legal
    within = [out[i] in best[i] and bool(torch.isfinite(legal[i][out[i]])) for i in range(len(out))]
    hits = {b: [within[i] and out[i] in best[i][:b] for i in range(len(out))] for b in BRANCHES}
    n = collections.Counter(tokens=len(out), tf_agree=sum(tf[i] == out[i] for i in range(len(out))),
                            tf_top2=sum(hits[2]), tf_top4=sum(hits[4]))
    for b, hit in hits.items():  # a tree of the draft's best b at every level, d deep, keeps the run of hits from i
        run = 0
        for i in reversed(range(len(out))):
            run = run + 1 if hit[i] else 0
            for d in DEPTHS:
                n[f"run_b{b}_d{d}"] += min(run, d)
    for ctx, toks in props:
        p = len(ctx) - P
        if toks and ctx[P:] != out[:p]:
            n["off_path_tokens"] += len(toks)
            continue
        for j, t in enumerate(toks):
            if p + j >= len(out) or toks[:j] != out[p:p + j]:
                break
            n["on_path"] += 1
            n["eq_teacher_forced_draft"] += t == tf[p + j]
            n["eq_target"] += t == out[p + j]
    per = {k: f"{s.accepted}/{s.proposed} judged {s.judged} overruled {s.overruled}"
           for k, s in dec.stats.per_drafter.items()}
    print(f"{w.id}: {dict(n)}; per drafter {per}; {dec.stats.tokens_per_forward:.2f} tokens per target pass")
    return n


def main() -> None:
    import specstruct as ss
    from specstruct.config import EngineConfig

    from specstruct.bench.workloads import extraction_workloads, prose_workloads

    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks.draft_agreement", description=(
        "Where the draft model and the target agree (typed extraction or prose): each draft token proposed on the "
        "target's path, against the teacher-forced draft and the target, and the target's token among the "
        "teacher-forced draft's best 1, 2 and 4 (the real Qwen pair, pulled)."),
        epilog="examples: python -m benchmarks.draft_agreement int8 2; "
               "python -m benchmarks.draft_agreement int8 5 --scenario prose --head-tokens 32768")
    parser.add_argument("numerics", nargs="?", default="float32", choices=["float32", "int8"],
                        help="the draft's numerics (default float32)")
    parser.add_argument("limit", nargs="?", type=int, default=2, help="prompts to run (default 2)")
    parser.add_argument("--scenario", choices=["extraction", "prose"], default="extraction",
                        help="the typed-extraction prompts (default) or the bench's prose prompts")
    parser.add_argument("--head-tokens", type=int, default=0,
                        help="the draft's LM head over the first N token ids only (0: all)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    eng = ss.SpecStruct.from_pretrained("qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b",
                                        engine_config=EngineConfig(draft_numerics=args.numerics,
                                                                   draft_head_tokens=args.head_tokens))
    total = collections.Counter()
    workloads = prose_workloads if args.scenario == "prose" else extraction_workloads
    for w in workloads(args.limit):
        total.update(analyse(eng, w))
    shares = {k: f"{total[k] / total['tokens']:.1%}" for k in ("tf_agree", "tf_top2", "tf_top4") if total["tokens"]}
    print("total", {k: v for k, v in total.items() if not k.startswith("run_")}, "teacher-forced agreement:", shares)
    if total["tokens"]:
        print("draft tokens a step would keep, teacher-forced (mean over positions): a tree of the draft's best b "
              "at every level, d deep (b = 1: a chain of d)")
        print("| b | " + " | ".join(f"d = {d}" for d in DEPTHS) + " |")
        print("|---|" + "---|" * len(DEPTHS))
        for b in BRANCHES:
            print(f"| {b} | " + " | ".join(f"{total[f'run_b{b}_d{d}'] / total['tokens']:.2f}" for d in DEPTHS) + " |")


if __name__ == "__main__":
    main()
