"""Speculative decoding under a constraint: propose, verify in one target pass, commit.

    speculator      Speculator: the target runtime, the proposers and the shared policy
    batch           BatchDecoder: every running row in one packed target pass per step
    row             one request as a batch row: constraint, proposals, verification, acceptance
    verify          greedy and speculative-sampling verification, as pure functions
    policy          how many candidates each proposer may offer (acceptance- and cost-aware)
    batch_policy    batch-aware draft lengths (goodput over the whole pass)
    prefill_budget  how many prompt tokens a step may prefill beside the decoding rows
    stops           stop strings, checked incrementally
    interfaces      the Protocols at the seams: Drafter, Policy, Runtime
    proposers/      forced text, prompt lookup, structure guesses, the draft model (draft_model: one pass per position)
"""
