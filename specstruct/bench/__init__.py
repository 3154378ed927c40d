"""The benchmark suite: specstruct against target-only decoding, outlines 1.x and transformers `generate`
on real workloads (JSONSchemaBench schemas and typed extraction, HumanEval, open-ended prose).

    from specstruct.bench import run_benchmark
    results = run_benchmark(engine, scenarios=["json"], limit=3)
    results["scenarios"]["json"]["speedup"]

Command line: `specstruct bench --help` (or `python -m specstruct.bench --help`). Modules: workloads
(prompts), extraction (passages and models), baselines (the timed sides), fairness (same weights,
named numerics), runner, summary (medians and spread), report (table, JSON, plot), cli.
"""

from specstruct.bench.fairness import ComparisonError
from specstruct.bench.runner import run_benchmark

__all__ = ["run_benchmark", "ComparisonError"]
