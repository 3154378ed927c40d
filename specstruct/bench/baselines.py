"""The sides of the comparison, each timed the same way on the same prompt tokens.

    specstruct   speculative constrained decoding (the engine as configured)
    target-only  the same engine and weights, speculation off (`SpecConfig(enable_speculative=False)`)
    outlines     outlines 1.x `from_transformers` on the same model object, same output type
    hf           plain `model.generate` (unconstrained)
    hf-assisted  `model.generate(assistant_model=draft)` (assisted generation, unconstrained)

Each side has `prepare(workload)` (untimed: constraint compilation, generator construction) and
`measure(workload) -> Measurement` (timed with one wall clock around the whole call, prefill included).
The specstruct sides live here; outlines and transformers `generate` in external.py; what they share in
measure.py.
"""

from __future__ import annotations

import time
from typing import Any

from specstruct.bench.fairness import engine_numerics
from specstruct.bench.measure import Measurement, Settings, _plain
from specstruct.bench.workloads import Workload


class SpecStructSide:
    """specstruct's own loop; `speculative=False` is the target-only baseline."""

    def __init__(self, name: str, engine: Any, speculative: bool, settings: Settings):
        self.name, self.engine, self.settings = name, engine, settings
        # retries would time 2+ generations; the prefix cache stays off (cold prefill), as for the other sides
        overrides = {"enable_speculative": speculative, "max_retries": 0, "use_prefix_cache": False}
        base = getattr(engine, "config", None)
        if base is None:
            from specstruct.config import SpecConfig

            base = SpecConfig()
        self.config = base.merged(**overrides)
        self.model = engine.model

    def numerics(self) -> str:
        return engine_numerics(self.engine)

    def prepare(self, workload: Workload) -> None:
        """Compile the constraint before the clock starts (the engine caches compiled constraints).
        A ConstraintError propagates: the runner records the workload as unsupported."""
        if workload.output_type is not None and hasattr(self.engine, "constraint"):
            self.engine.constraint(workload.output_type)

    def measure(self, workload: Workload, repeat: int = 0) -> Measurement:
        """One timed run. Run `repeat` > 0 of a prompt is another tenant (cache_salt) of the suffix index, whose
        earlier requests are that repeat's own: it never proposes what an earlier repeat of this prompt wrote."""
        from specstruct.errors import IncompleteOutputError, ValidationRetryError

        s = self.settings
        tenant = {"cache_salt": f"bench-repeat-{repeat}"} if repeat else {}
        start = time.perf_counter()
        try:
            res = self.engine.run(workload.messages, workload.output_type, max_new_tokens=s.max_new_tokens,
                                  temperature=s.temperature, top_p=s.top_p, seed=s.seed, config=self.config,
                                  **tenant)
        except IncompleteOutputError as exc:  # max_new_tokens cut a structured output short: still a timing
            elapsed = time.perf_counter() - start
            why = f"IncompleteOutputError: {str(exc).splitlines()[0][:200]}"
            if getattr(exc, "stats", None) is not None:  # engines that attach their stats keep every figure
                m = self._from_stats(exc.stats, exc.text, list(exc.token_ids), "length", elapsed)
                m.error = why
                return m
            n = len(exc.token_ids)
            return Measurement(self.name, exc.text, list(exc.token_ids), new_tokens=n, elapsed_s=elapsed,
                               tokens_per_s=n / elapsed if elapsed > 0 else 0.0, finish_reason="length", error=why)
        except ValidationRetryError as exc:  # the text parsed badly; its stats are in the attempt
            elapsed = time.perf_counter() - start
            last = exc.attempts[-1]
            m = self._from_stats(last["stats"], last["text"], [], None, elapsed)
            m.error = f"ValidationRetryError: {last['error'][:200]}"
            return m
        return self._from_stats(res.stats, res.text, list(res.token_ids), res.finish_reason,
                                time.perf_counter() - start)

    def _from_stats(self, st: Any, text: str, ids: list[int], finish: str | None, elapsed: float) -> Measurement:
        n = int(getattr(st, "new_tokens", len(ids)))
        plain = st.to_dict() if hasattr(st, "to_dict") else {}
        return Measurement(
            side=self.name, text=text, token_ids=ids, prompt_tokens=int(st.prompt_tokens),
            new_tokens=n, elapsed_s=elapsed, tokens_per_s=n / elapsed if elapsed > 0 else 0.0,
            finish_reason=finish, target_forwards=st.target_forwards, drafted=st.drafted,
            accepted=st.accepted, acceptance_rate=st.acceptance_rate, tokens_per_forward=st.tokens_per_forward,
            per_drafter=_plain(plain.get("per_drafter", getattr(st, "per_drafter", {})) or {}),
            k_histogram={str(k): v for k, v in (getattr(st, "k_histogram", {}) or {}).items()},
            times={"engine_elapsed_s": st.elapsed_s, "prefill_s": getattr(st, "prefill_s", None),
                   "mask_s": st.mask_time_s, "draft_s": st.draft_time_s, "verify_s": st.verify_time_s},
        )
