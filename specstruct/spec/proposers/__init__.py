"""Candidate sources for speculative decoding. Each proposes tokens that the constraint allows; the target
verifies them. `forced`, `lookup` and `guess` cost nothing to draft; `model` runs a small draft model. Which exist and
in which order: registry.py."""

from specstruct.spec.proposers.forced import ForcedTextDrafter
from specstruct.spec.proposers.lookup import PromptLookupDrafter
from specstruct.spec.proposers.guess import StructureGuessDrafter
from specstruct.spec.proposers.draft_model import DraftModelDrafter

__all__ = ["ForcedTextDrafter", "PromptLookupDrafter", "StructureGuessDrafter", "DraftModelDrafter"]
