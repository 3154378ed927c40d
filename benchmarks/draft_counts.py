"""How many target and draft passes JSON extraction takes: counts that do not depend on machine load.

    python -m benchmarks.draft_counts [--prompts 8] [--out outputs.json]

Runs the first N typed-extraction prompts on a fresh engine (real Qwen pair, greedy, prefix cache off) and prints,
per prompt and in total: output tokens, target passes after prefill, draft-model passes, decode seconds; then
tokens per target pass, draft passes per output token and acceptance (accepted / drafted). `--out` saves the
token ids per prompt, so two commits can be compared for identical outputs (run each in its own checkout).
"""

from __future__ import annotations

import argparse
import collections
import json


def main(argv: list[str] | None = None) -> None:
    import torch

    import specstruct as ss
    from specstruct.config import EngineConfig

    from specstruct.bench.workloads import extraction_workloads

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--out", help="write the output token ids per prompt here (JSON)")
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    eng = ss.SpecStruct.from_pretrained("qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b",
                                        engine_config=EngineConfig(prefix_cache_bytes=0))
    runtime = eng.speculator.drafters["model"].runtime
    calls = collections.Counter()
    inner = runtime.forward

    def counted(segments, keep):
        calls["passes"] += 1
        return inner(segments, keep)

    runtime.forward = counted
    total, outputs = collections.Counter(), {}
    for w in extraction_workloads(args.prompts):
        calls.clear()
        r = eng.run(w.messages, w.output_type, max_new_tokens=256)
        s = r.stats
        outputs[w.id] = r.token_ids
        decode = s.elapsed_s - s.prefill_s
        total.update(tokens=s.new_tokens, passes=s.target_forwards - 1, draft_passes=calls["passes"],
                     drafted=s.drafted, accepted=s.accepted, decode_ms=int(1000 * decode))
        print(f"{w.id}: {s.new_tokens} tokens, {s.target_forwards - 1} target passes, {calls['passes']} draft "
              f"passes, {decode:.1f} s decode", flush=True)
    print(f"total {dict(total)}; tokens per target pass {total['tokens'] / max(total['passes'], 1):.2f}, draft "
          f"passes per token {total['draft_passes'] / max(total['tokens'], 1):.2f}, acceptance "
          f"{total['accepted'] / max(total['drafted'], 1):.1%}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(outputs, f)


if __name__ == "__main__":
    main()
