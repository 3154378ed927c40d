"""specstruct: guaranteed structured output from local transformers models, made fast by grammar-aware
speculative decoding."""

from .api import SpecStruct
from .config import BatchConfig, SpecConfig
from .errors import (
    ConstraintError,
    EngineClosedError,
    IncompatibleDraftError,
    IncompleteOutputError,
    ModelNotFoundError,
    OverloadedError,
    PromptTooLongError,
    RequestTimeoutError,
    SpecStructError,
    ValidationRetryError,
)
from .models import pull
from .output_types import Choice, Code, Grammar, Regex
from .results import Chunk, DrafterStats, Result, Stats

__all__ = [
    "SpecStruct", "SpecConfig", "BatchConfig", "Result", "Stats", "DrafterStats", "Chunk",
    "Regex", "Choice", "Grammar", "Code", "pull",
    "SpecStructError", "ConstraintError", "IncompleteOutputError", "ValidationRetryError", "ModelNotFoundError",
    "IncompatibleDraftError", "PromptTooLongError", "OverloadedError", "RequestTimeoutError", "EngineClosedError",
]
__version__ = "0.1.0"
