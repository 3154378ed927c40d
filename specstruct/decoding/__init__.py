"""The decode loop and what it drives: token ids + a Constraint in, committed tokens and Stats out.

    engine       Engine (runtime, drafters, policy) and Decode: one request, decoded as a batch of one
    batch        BatchDecoder: many requests in lockstep, one packed target pass per step
    row          one request's state as a batch row: constraint, drafting, verification, acceptance
    batch_policy batch-aware draft lengths (goodput over the whole pass)
    draft_batch  the draft model proposing for many rows in packed passes
    interfaces   the Protocols at the seams: Drafter, Policy, Runtime (Constraint lives in specstruct.constraints)
    policy       how many candidates each drafter may propose (acceptance- and cost-aware)
    verify       greedy and speculative-sampling verification, as pure functions
    runtime      a model with per-sequence KV caches, with row-invariant CPU numerics
    linear       the row-invariant Linear kernel (oneDNN, >= 2 rows) and its prepacked weights
    packed       packed ragged passes: many sequences in one forward, each attending to its own KV
    openmp       only the computing thread keeps an OpenMP worker pool (idle pools slow it down)
    drafting/    forced text, prompt lookup, draft model
"""
