"""The server's configurable limits (body size, max_tokens cap, prompt tokens, timeout, queue)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerLimits:
    """Limits applied to every request. A request past one gets a 400/413/429 naming the limit, never a 500.

    - max_body_bytes: request bodies larger than this get 413.
    - max_tokens_cap: a `max_tokens` above this gets 400; a request without one gets `default_max_tokens`.
    - max_prompt_tokens: a longer prompt (chat template applied) gets 400 (None: the model's context window).
    - request_timeout_s: a request still running after this is cancelled (504, or an error event mid-stream).
    - max_queued_requests: requests in the server at once; past it, 429 with `Retry-After: retry_after_s`.
    """

    max_body_bytes: int = 4 * 1024 * 1024
    max_tokens_cap: int = 4096
    default_max_tokens: int = 512
    max_prompt_tokens: int | None = None
    request_timeout_s: float = 600.0
    max_queued_requests: int = 256
    retry_after_s: int = 1
