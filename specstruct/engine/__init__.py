"""The engine: one thread that owns the models, and the queue in front of it.

    core        build() -> Engine: runtimes, speculator, KV memory and scheduler, assembled in one place
    scheduler   Scheduler: admission, batching, cancellation and the decode loop (one thread)
    request     Request: the caller's handle (result, tokens, cancel); what crosses threads
    preempt     Preemption: past the KV budget, the newest rows pause (KV spilled) and resume later
"""
