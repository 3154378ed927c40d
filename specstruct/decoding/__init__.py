"""The decode loop and what it drives: token ids + a Constraint in, committed tokens and Stats out.

    engine      the loop: commit, plan, draft, verify, rollback, observe (one request)
    interfaces  the Protocols at the seams: Drafter, Policy, Runtime (Constraint lives in specstruct.constraints)
    policy      how many candidates each drafter may propose (acceptance- and cost-aware)
    verify      greedy and speculative-sampling verification, as pure functions
    runtime     a model plus its KV cache, with row-invariant CPU numerics
    drafting/   forced text, prompt lookup, draft model
"""
