"""The records that cross a decode step's seams: the planner's StepPlan, the runner's StepResult.

    BatchDecoder.plan()           -> StepPlan    which rows, the tokens each feeds, their proposals and masks, their KV
    BatchDecoder.execute(plan)    -> StepResult  one packed target pass over the plan's segments (nothing else)
    BatchDecoder.apply(plan, res) -> tokens      acceptance, the policy's costs, stats, the prefix cache: in one place

Both are frozen: the runner reads the plan and nothing else, the applier reads the plan and the result. (As vLLM's
SchedulerOutput, ModelRunnerOutput and update_from_output.) The rows themselves are live objects the plan names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specstruct.spec.interfaces import Proposal, Sequence_

if TYPE_CHECKING:
    import torch

    from specstruct.spec.row import Row


@dataclass(frozen=True)
class Verify:
    """A decoding row's segment: its last committed token and its candidates, verified under `masks` (the
    constraint's bitmask words of each position, rows of one buffer: the target needs only the logits they allow)."""

    row: "Row"
    kv: "Sequence_"
    feed: tuple[int, ...]
    masks: "tuple[torch.Tensor, ...]"
    proposal: Proposal
    with_model: bool  # the model-step proposer drafted for it this step (a lone row's step times count per arm)

    @property
    def keep(self) -> int:
        return len(self.feed)


@dataclass(frozen=True)
class Prefill:
    """A chunk of a row's prompt (or, after a lost spill, of its committed tokens) appended to its KV."""

    row: "Row"
    kv: "Sequence_"
    feed: tuple[int, ...]
    keep: int  # 1 where the chunk ends the prompt (its logits choose the first token), else 0


@dataclass(frozen=True)
class StepPlan:
    """Everything one target pass does, decided before it runs."""

    rows: "tuple[Row, ...]"  # every row in the batch when the step began (those the plan leaves out emit nothing)
    verify: tuple[Verify, ...] = ()
    prefill: tuple[Prefill, ...] = ()
    started: float = 0.0  # perf_counter() when planning began (a lone row's step time includes its drafting)

    @property
    def entries(self) -> "tuple[Verify | Prefill, ...]":
        """The pass's segments in order: decoding rows, then prefill chunks."""
        return self.verify + self.prefill

    def segments(self) -> "list[tuple[Any, tuple[int, ...]]]":
        return [(e.kv, e.feed) for e in self.entries]

    def keep(self) -> list[int]:
        return [e.keep for e in self.entries]

    def masks(self) -> "list[tuple[torch.Tensor, ...] | None]":
        return [e.masks for e in self.verify] + [None] * len(self.prefill)

    @property
    def tokens(self) -> int:
        """Rows of the pass (the tokens it feeds)."""
        return sum(len(e.feed) for e in self.entries)


@dataclass(frozen=True)
class StepResult:
    """What the target pass gave: logits per entry of the plan (in `plan.entries` order), its seconds, or the error
    that failed it (then every row in the pass has a half-written cache)."""

    logits: "tuple[torch.Tensor, ...]" = ()
    seconds: float = 0.0
    error: BaseException | None = None
