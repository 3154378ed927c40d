"""What a generation returns: the value, its text and tokens, and the statistics of how it was decoded."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass
class DrafterStats:
    """One drafter's candidates that the target judged: `proposed` counts its accepted tokens plus the first one
    rejected (tokens after a rejection, its own or an earlier drafter's, were never judged and are not counted),
    so `acceptance_rate` is the per-token acceptance probability."""

    proposed: int = 0
    accepted: int = 0
    judged: int = 0  # proposed tokens the target reached (not after an earlier drafter's rejected token)
    overruled: int = 0  # free candidates the draft model replaced with its own choice (greedy arbitration)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0


@dataclass
class Stats:
    """How a generation was decoded. Times are wall-clock seconds on this process."""

    mode: str = "text"
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # prompt tokens whose KV came from the prefix cache (not prefilled)
    new_tokens: int = 0
    target_forwards: int = 0  # target passes, prefill included
    drafted: int = 0
    accepted: int = 0
    elapsed_s: float = 0.0
    prefill_s: float = 0.0
    mask_time_s: float = 0.0
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0  # target passes after prefill
    per_drafter: dict[str, DrafterStats] = field(default_factory=dict)
    k_histogram: dict[int, int] = field(default_factory=dict)  # candidates per step -> steps
    queue_s: float = 0.0  # from submission to admission into a batch slot (waiting; the prefill is not in it)
    batch_rows: float = 0.0  # mean rows per pass among the passes this request shared (1.0 = decoded alone)
    preempted: int = 0  # times the scheduler paused it to free KV memory for older requests (docs/kv-memory.md)
    numerics: str = ""

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def steps(self) -> int:
        """Decode steps (target passes after the prefill that verified candidates or not)."""
        return sum(self.k_histogram.values())

    @property
    def candidates_per_step(self) -> float:
        """Candidates verified per decode step, on average (k_histogram holds the distribution)."""
        return self.drafted / self.steps if self.steps else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["per_drafter"] = {
            k: {"proposed": v.proposed, "accepted": v.accepted, "acceptance_rate": v.acceptance_rate,
                "judged": v.judged, "overruled": v.overruled}
            for k, v in self.per_drafter.items()
        }
        d.update(
            acceptance_rate=self.acceptance_rate,
            candidates_per_step=self.candidates_per_step,
            tokens_per_forward=self.tokens_per_forward,
            tokens_per_s=self.tokens_per_s,
        )
        return d


@dataclass
class Result(Generic[T]):
    """The value, its text and tokens, and how it was decoded.

    Losslessness: with row-invariant numerics (`stats.numerics` says "row-invariant": CPU, GGUF blocks or
    float32, an architecture the row-wise attention is exact for), greedy speculative output equals greedy
    target-only output token for token. With stock numerics (CUDA, bfloat16/float16, attention sinks, a window or
    soft-cap the row-wise attention does not compute; `stats.numerics` names the reason) every token is the target's own
    choice on the pass that verified it and always matches the constraint, but a near-tie may resolve
    differently than in one-token-at-a-time decoding.

    `text` is cut before the first stop string; `token_ids` end with the token that completed it. A constrained
    value is always complete under its constraint: a stop string or max_new_tokens that cut it short raises
    IncompleteOutputError instead."""

    value: T
    text: str
    token_ids: list[int]
    stats: Stats
    finish_reason: str = "stop"  # "stop" (EOS or stop string) or "length" (max_new_tokens)
    attempts: list[dict[str, Any]] = field(default_factory=list)  # failed validation attempts before this one


@dataclass
class Chunk:
    """One streaming update: `text` is new since the previous chunk; `partial` the partial object parsed so far
    (JSON modes) or None; `result` is set on the last chunk only."""

    text: str
    partial: Any = None
    result: Result[Any] | None = None
