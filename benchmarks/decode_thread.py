"""The same decode on the main thread and on a second thread, with and without the main thread's OpenMP pool.

    python -m benchmarks.decode_thread [--repeats 2]

One typed extraction (the Hopper passage) on the real Qwen pair, greedy, prefix cache off, run through
`testing.run_alone` (the batch decoder with one row, no scheduler) in three places, `--repeats` times each, in
one process:

    main               the main thread, which loaded the model and holds its OpenMP pool
    thread, pool kept  a new thread while the main thread's pool is alive (re-created first by a torch op)
    thread, released   a new thread after the main thread gave its pool back (runtime/openmp.py)

Prints seconds in all, prefill, draft and verify per run. docs/benchmarks.md ("The decode thread") has the results.
"""

from __future__ import annotations

import argparse
import threading
import time
from specstruct.testing import run_alone


def main(argv: list[str] | None = None) -> None:
    import torch

    import specstruct as ss
    from specstruct.runtime.openmp import release_pool

    from specstruct.bench.workloads import extraction_workloads

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    eng = ss.SpecStruct.from_pretrained("qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b")
    work = extraction_workloads(1)[0]
    cfg = eng.config.merged(max_new_tokens=128, use_prefix_cache=False)
    ids = eng.prompt_ids(work.messages, work.output_type, max_new_tokens=128)

    def decode(where: str) -> None:
        t0 = time.perf_counter()
        st = run_alone(eng.speculator.row(ids, eng.constraint(work.output_type).fork(), cfg)).stats
        print(f"{where:18s} {time.perf_counter() - t0:6.2f} s   prefill {st.prefill_s:5.2f}   draft "
              f"{st.draft_time_s:5.2f}   verify {st.verify_time_s:5.2f}   ({st.new_tokens} tokens)", flush=True)

    def on_thread(where: str) -> None:
        t = threading.Thread(target=decode, args=(where,))
        t.start()
        t.join()

    for _ in range(args.repeats):
        torch.randn(512, 512) @ torch.randn(512, 512)  # the main thread computes: its pool exists
        decode("main")
        on_thread("thread, pool kept")
        release_pool()
        on_thread("thread, released")


if __name__ == "__main__":
    main()
