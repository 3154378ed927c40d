"""The proposers an engine may use, in the order a step concatenates their candidates. Adding one is a module with
its class (its `traits`, `create` and `propose` or `propose_batch`) and one line in REGISTERED; the policy, the row
and the batch see proposers only through their traits (interfaces.Traits)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Protocol, Sequence, cast

from specstruct.spec.interfaces import BatchProposer, Drafter, Proposer, Setup, TenantDrafter, Traits
from specstruct.spec.proposers.draft_model import DraftModelDrafter, Job
from specstruct.spec.proposers.forced import ForcedTextDrafter
from specstruct.spec.proposers.guess import StructureGuessDrafter
from specstruct.spec.proposers.lookup import PromptLookupDrafter
from specstruct.spec.proposers.suffix import SuffixIndexDrafter


class Registered(Protocol):
    """A proposer class: its traits, and how to build it from the engine's Setup (None: not available)."""

    traits: Traits

    def create(self, setup: Setup) -> Proposer | None: ...


REGISTERED: tuple[Registered, ...] = (ForcedTextDrafter, PromptLookupDrafter, SuffixIndexDrafter, StructureGuessDrafter,
                                      DraftModelDrafter)

TRAITS: dict[str, Traits] = {cls.traits.name: cls.traits for cls in REGISTERED}  # name -> traits, in order


@dataclass(frozen=True)
class Proposers:
    """An engine's proposers: the free ones a row runs itself, in order, and the model-step one the batch runs for
    every row at once after them (one at most: a step has one draft pass)."""

    free: dict[str, Drafter]
    batched: BatchProposer[Job] | None = None

    def all(self) -> dict[str, Proposer]:
        """Every proposer by name, in the registered order."""
        out: dict[str, Proposer] = dict(self.free)
        if self.batched is not None:
            out[self.batched.name] = self.batched
        return out

    def remember(self, switches: object, tenant: Hashable, ids: Sequence[int]) -> None:
        """A finished request (`switches`: its SpecConfig): every per-tenant proposer it had switched on learns its
        prompt and output (`ids`) under `tenant`."""
        for p in self.free.values():
            if p.traits.per_tenant and getattr(switches, p.traits.switch, False):
                cast(TenantDrafter, p).remember(tenant, ids)


def build(setup: Setup) -> Proposers:
    """The available proposers (a class's `create` returns None where it cannot run, e.g. no draft model)."""
    free: dict[str, Drafter] = {}
    batched: list[BatchProposer[Job]] = []
    for cls in REGISTERED:
        p = cls.create(setup)
        if p is None:
            continue
        if p.traits.model_step:
            batched.append(cast("BatchProposer[Job]", p))
        else:
            free[p.traits.name] = cast(Drafter, p)
    if len(batched) > 1:
        raise ValueError(f"at most one model-step proposer is supported (a step has one draft pass): "
                         f"{[b.name for b in batched]} are registered; drop all but one from REGISTERED")
    return Proposers(free, batched[0] if batched else None)
