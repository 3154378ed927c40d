"""The server's configurable limits (header and body size, max_tokens cap, prompt tokens, timeout, queue, stop strings, tools,
constraint sizes). Every one has a `specstruct serve` flag; docs/server.md lists them with their defaults."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class ServerLimits:
    """Limits applied to every request. A request past one gets a 400/413/429 naming the limit, never a 500.

    - max_header_bytes: a request head (request line and headers) larger than this gets 431 and its connection is
      closed, before anything else reads it (the h11 parser's limit: http.py).
    - max_header_field_bytes: one header (name and value) larger than this gets 431.
    - max_body_bytes: request bodies larger than this get 413.
    - max_tokens_cap: a `max_tokens` above this gets 400; a request without one gets `default_max_tokens`.
    - max_prompt_tokens: a longer prompt (chat template applied) gets 400 (None: the model's context window).
    - request_timeout_s: a request still running after this is cancelled (504, or an error event mid-stream).
    - max_queued_requests: requests in the server at once; past it, 429 with `Retry-After: retry_after_s`.
    - max_stop_sequences, max_stop_chars: how many `stop` strings, and their characters in all (OpenAI takes 4).
    - max_tools, max_tools_bytes: how many `tools`, and the size of their definitions as JSON (OpenAI takes 128).
    - max_constraint_bytes: the size of one output constraint as sent (a JSON schema as JSON, a regex, a Lark
      grammar, a choice list).
    """

    max_header_bytes: int = 64 * 1024
    max_header_field_bytes: int = 16 * 1024
    max_body_bytes: int = 4 * 1024 * 1024
    max_tokens_cap: int = 4096
    default_max_tokens: int = 512
    max_prompt_tokens: int | None = None
    request_timeout_s: float = 600.0
    max_queued_requests: int = 256
    retry_after_s: int = 1
    max_stop_sequences: int = 16
    max_stop_chars: int = 4096
    max_tools: int = 128
    max_tools_bytes: int = 256 * 1024
    max_constraint_bytes: int = 256 * 1024

    @classmethod
    def from_options(cls, **options: Any) -> "ServerLimits":
        """The limits from `specstruct serve`'s options (its keyword names; others are ignored)."""
        renamed = {"request_timeout": "request_timeout_s", "max_queue": "max_queued_requests"}
        known = {f.name for f in fields(cls)}
        return cls(**{renamed.get(k, k): v for k, v in options.items() if renamed.get(k, k) in known})
