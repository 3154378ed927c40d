"""Speculative decoding under a constraint: propose, verify in one target pass, commit.

    speculator      Speculator: the target runtime, the proposers and the shared policy
    batch           BatchDecoder: every running row in one packed target pass per step (plan -> execute -> apply)
    step_plan       the frozen records between those: StepPlan (what the pass does), StepResult (what it gave)
    kv_reuse        where a row's KV starts (a cached prefix) and what the prefix cache keeps of it
    row             one request as a batch row: constraint, proposals, verification, acceptance
    verify          greedy and speculative-sampling verification, as pure functions
    policy          how many candidates each proposer may offer (acceptance- and cost-aware)
    batch_policy    batch-aware draft lengths (goodput over the whole pass)
    prefill_budget  how many prompt tokens a step may prefill beside the decoding rows
    stops           stop strings, checked incrementally
    interfaces      the Protocols at the seams: Proposer (Drafter, BatchProposer), Policy, Runtime
    proposers/      forced text, prompt lookup, structure guesses, the draft model (draft_model: one pass per position);
                    registry.py lists them, in candidate order
"""
