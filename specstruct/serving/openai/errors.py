"""OpenAI-style error objects (`{"error": {"message", "type", "param", "code"}}`) and the mapping from
specstruct's exceptions to HTTP statuses: bad input is a 4xx naming the problem, never a 500."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from specstruct import errors as ss_errors


class APIError(Exception):
    """An error the server answers with: HTTP status plus OpenAI's error fields."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        message = clip(message)  # an error never echoes a megabyte of grammar or schema back
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


MAX_MESSAGE_CHARS = 2000  # error bodies stay a few KB whatever text they quote


def clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`text` cut to `limit` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    keep = limit - 60
    return f"{text[:keep]}... ({len(text) - keep} more characters not shown)"


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def overloaded(retry_after_s: float, message: str | None = None) -> APIError:
    seconds = max(1, int(round(retry_after_s)))
    return APIError(429, message or "the server is at its queue limit; retry after the Retry-After delay",
                    type="rate_limit_error", code="overloaded", headers={"Retry-After": str(seconds)})


def shutting_down() -> APIError:
    """A request the server ended because it is shutting down: retryable, elsewhere."""
    return APIError(503, "this server is shutting down and cancelled the request; retry (another replica may serve "
                    "it)", type="server_error", code="shutting_down")


NO_RETRY = {"x-should-retry": "false"}  # the openai SDK retries 5xx unless told not to (its own header)


def from_exception(exc: BaseException, *, constraint_param: str | None = None, retry_after_s: float = 1,
                   prompt_param: str = "messages") -> APIError:
    """The APIError for an exception raised while preparing or running a request."""
    if isinstance(exc, APIError):
        return exc
    if type(exc).__name__ == "OverloadedError" or hasattr(exc, "retry_after_s"):
        return overloaded(getattr(exc, "retry_after_s", None) or retry_after_s, str(exc) or None)
    if isinstance(exc, ss_errors.ConstraintError):
        return bad_request(str(exc), constraint_param, "unsupported_constraint")
    if isinstance(exc, ss_errors.InvalidParameterError):
        return bad_request(str(exc), None, "invalid_value")
    if isinstance(exc, (ss_errors.PromptTooLongError, ss_errors.KVMemoryError)):  # the request can never fit
        return bad_request(str(exc).replace("max_new_tokens", "max_tokens"), prompt_param, "context_length_exceeded")
    if isinstance(exc, ss_errors.InvalidPromptError):
        return bad_request(str(exc), prompt_param, "invalid_value")
    if isinstance(exc, ss_errors.EngineClosedError):  # retryable elsewhere: a replica that is going away
        return APIError(503, f"this server's engine is closed ({exc}); retry, another replica may serve it",
                        type="server_error", code="engine_unavailable")
    if isinstance(exc, ss_errors.ValidationRetryError):  # the same request fails the same way: not worth a retry
        return APIError(500, f"the output failed validation: {exc}", type="server_error", code="validation_failed",
                        headers=NO_RETRY)
    return APIError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error", code="internal_error")
