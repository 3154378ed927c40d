"""Candidate sources for speculative decoding. Each proposes tokens that the constraint allows; the target
verifies them. `forced` and `lookup` cost nothing to draft; `model` runs a small draft model."""

from .forced import ForcedTextDrafter
from .lookup import PromptLookupDrafter
from .model import DraftModelDrafter

__all__ = ["ForcedTextDrafter", "PromptLookupDrafter", "DraftModelDrafter"]
