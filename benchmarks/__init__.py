"""Developer probes: one question each about a kernel, a step or a policy, measured on real models.

They are not shipped with the package (the user-facing suite is `specstruct bench`). Run one from the repository
root, e.g. `python -m benchmarks.step_cost --help`:

    step_cost        one target pass (1 and 9 tokens) and a cold prefill, side by side with llama-bench
    forward_cost     a pass's cost against how many tokens it verifies
    step_breakdown   where one step's time goes (linears, attention, the rest)
    kernel_ab        the fixed-order linear kernel against oneDNN and stock torch
    step_ab          two runtimes' steps, A/B, interleaved
    attention_ab     the row-wise attention against the model's own
    attention_stream a decode step's attention on a long cache against the memory's rate
    decode_thread    OpenMP pools and the computing thread
    load_memory      resident and peak memory of loading the default pair
    draft_agreement  how often the draft agrees with the target on the free candidates
    draft_counts     how many candidates each proposer offered and had accepted
    ablation         the policy and proposers switched off one at a time
    lookup_trace     what prompt lookup's matches are worth, and how many passes the sparse LM head serves
    int8_peak        this CPU's int8 multiply-add peak (vpdpbusd on all threads) and the block-quantized kernel's share
"""
