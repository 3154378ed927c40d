"""specstruct: guaranteed structured output from local transformers models, made fast by grammar-aware
speculative decoding.

Names load on first use (PEP 562), so `import specstruct` and the `specstruct --help` command stay cheap: torch
and transformers are imported when `SpecStruct` (or anything that needs them) is first touched."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "SpecStruct": "api.specstruct", "SpecConfig": "config", "EngineConfig": "config", "BatchConfig": "config", "Result": "results",
    "Stats": "results", "DrafterStats": "results", "Chunk": "results", "Regex": "types.output",
    "Choice": "types.output", "Grammar": "types.output", "Code": "types.output", "pull": "models",
    "ToolReply": "api.tool_replies", "RawPrompt": "api.inputs",
    **{name: "errors" for name in (
        "SpecStructError", "ConstraintError", "IncompleteOutputError", "ValidationRetryError", "ModelNotFoundError",
        "IncompatibleDraftError", "PromptTooLongError", "InvalidPromptError", "InvalidParameterError",
        "MissingExtraError", "OverloadedError", "RequestTimeoutError", "RequestCancelledError", "EngineClosedError",
        "KVMemoryError", "SettingsError")},
}
_SUBMODULES = {"api", "types", "engine", "spec", "runtime", "constraints", "models", "serving", "cli", "bench",
               "config", "errors", "results", "extras", "settings", "testing"}
__all__ = list(_WHERE)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"specstruct.{name}")
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'specstruct' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"specstruct.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # static type checkers and IDEs see ordinary imports
    from specstruct.api.specstruct import SpecStruct
    from specstruct.config import BatchConfig, EngineConfig, SpecConfig
    from specstruct.errors import (ConstraintError, EngineClosedError, IncompatibleDraftError, IncompleteOutputError,
                                   InvalidParameterError, InvalidPromptError, MissingExtraError, ModelNotFoundError,
                                   PromptTooLongError, OverloadedError, RequestCancelledError, RequestTimeoutError,
                                   SettingsError, SpecStructError,
                                   ValidationRetryError, KVMemoryError)
    from specstruct.models import pull
    from specstruct.types.output import Choice, Code, Grammar, Regex
    from specstruct.results import Chunk, DrafterStats, Result, Stats
    from specstruct.api.inputs import RawPrompt
    from specstruct.api.tool_replies import ToolReply
