"""Every error specstruct raises: each names the problem and how to fix it."""

from __future__ import annotations

from typing import Any


class SpecStructError(Exception):
    """Base class of all specstruct errors."""


class ConstraintError(SpecStructError, ValueError):
    """The output type cannot be compiled into a constraint (unsupported keyword, bad regex or grammar,
    unsatisfiable schema). specstruct never falls back to unconstrained output."""


class ModelNotFoundError(SpecStructError, FileNotFoundError):
    """A model name, folder or file could not be resolved; the message says which command fixes it."""


class IncompatibleDraftError(SpecStructError, ValueError):
    """The draft model's vocabulary differs from the target's, so its tokens cannot be verified."""


class PromptTooLongError(SpecStructError, ValueError):
    """The prompt plus max_new_tokens does not fit in the model's context window."""


class InvalidPromptError(SpecStructError, ValueError):
    """The prompt is not a string or a list of chat messages ({"role": ..., "content": str}), or holds text that
    cannot be encoded (a lone surrogate). The message names the item and how to fix it."""


class InvalidParameterError(SpecStructError, ValueError):
    """A decoding parameter (temperature, top_p, seed, max_new_tokens, ...) is out of range."""


class SettingsError(SpecStructError, ValueError):
    """A SPECSTRUCT_* environment variable holds a value specstruct cannot use; the message names the variable, the
    value and what it accepts (specstruct.settings)."""


class MissingExtraError(SpecStructError, ImportError):
    """An optional dependency is not installed; the message names the `pip install -e ".[extra]"` that adds it."""


class KVMemoryError(SpecStructError, ValueError):
    """A request's KV cache could never fit in EngineConfig.kv_memory.active_bytes: refused before it starts."""


class IncompleteOutputError(SpecStructError):
    """max_new_tokens ran out before the constrained output was complete. `.text` holds what was generated."""

    def __init__(self, message: str, text: str = "", token_ids: list[int] | None = None, stats: Any = None,
                 reason: str = "length"):
        super().__init__(message)
        self.text = text
        self.token_ids = token_ids or []
        self.stats = stats  # the run's ss.Stats: how far it got, and at what speed
        self.reason = reason  # what cut it: "length" (max_new_tokens) or "stop" (a stop string)


class ValidationRetryError(SpecStructError):
    """The output kept failing validation after every retry. `.attempts` holds each attempt's text and error."""

    def __init__(self, message: str, attempts: list[dict[str, Any]]):
        super().__init__(message)
        self.attempts = attempts


class OverloadedError(SpecStructError, RuntimeError):
    """More requests are waiting than `BatchConfig.max_queue` allows: retry later (a server answers 429/503),
    raise max_queue, or send fewer requests at once."""


class RequestTimeoutError(SpecStructError, TimeoutError):
    """A request's `timeout=` ran out (waiting for a slot plus decoding); it was cancelled and its slot freed."""


class EngineClosedError(SpecStructError, RuntimeError):
    """The engine was closed (`engine.close()`, the end of a `with` block, or interpreter exit)."""


class RequestCancelledError(SpecStructError, RuntimeError):
    """The request was cancelled (`cancel()`, or its reader went away) before it wrote an output."""
