"""What every request passes before it reaches the engine: the API key (constant-time), the body size limit,
JSON and schema parsing (400 naming the field, never FastAPI's 422), and admission (429 past the queue)."""

from __future__ import annotations

import hmac
import json
import re
import sys
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from specstruct.serving.openai.errors import APIError, bad_request, overloaded
from specstruct.serving.openai.limits import ServerLimits

M = TypeVar("M", bound=BaseModel)


def authorize(request: Request, api_key: str | None) -> None:
    if api_key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    given = token.strip() if scheme.lower() == "bearer" else ""
    if not hmac.compare_digest(given.encode(), api_key.encode()):
        raise APIError(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                       type="authentication_error", code="invalid_api_key")


async def read_json(request: Request, limits: ServerLimits) -> Any:
    """The body as JSON; 413 past `limits.max_body_bytes` (checked on the header and while reading)."""
    too_big = APIError(413, f"the request body is over this server's limit of {limits.max_body_bytes} bytes",
                       code="request_too_large")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
        raise too_big
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limits.max_body_bytes:
            raise too_big
    try:
        return json.loads(body, parse_int=_read_int, parse_constant=_no_constant)
    except _Unreadable as e:
        raise bad_request(f"the request body cannot be read: {e}", code="invalid_json") from None
    except RecursionError:
        raise bad_request("the request body nests arrays or objects too deeply to read; flatten it",
                          code="invalid_json") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, and whatever else json.loads refuses
        raise bad_request(f"the request body is not valid JSON ({e})", code="invalid_json") from None


class _Unreadable(ValueError):
    """A value the body reader refuses by name (a number JSON allows but Python cannot read, or NaN)."""


def _read_int(text: str) -> int:
    """Python reads at most `sys.get_int_max_str_digits()` digits (4,300) into an int: a longer integer is refused
    here, naming it, rather than as json.loads' bare ValueError (no field takes an integer that large anyway)."""
    limit = sys.get_int_max_str_digits() or len(text)
    if len(text.lstrip("-")) > limit:
        raise _Unreadable(f"it holds an integer of {len(text.lstrip('-'))} digits, more than the {limit} this server "
                          f"reads ({text[:20]}...); send a smaller number")
    return int(text)


def _no_constant(name: str) -> float:
    raise _Unreadable(f"it holds {name}, which is not a number JSON allows; send a number")


def parse(model: type[M], body: Any) -> M:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object", code="invalid_json")
    try:
        return model.model_validate(body)
    except ValidationError as e:
        errors = e.errors()  # of a union's members, the one that got furthest into the value says most
        err = max(errors, key=lambda er: len(er["loc"]))  # (max keeps the first of equals)
        where = field_path(err["loc"])
        raise bad_request(f"{where}: {err['msg']}" if where else err["msg"], where, "invalid_value") from None


def field_path(loc: tuple) -> str | None:
    """A pydantic error location as the request's own path, `messages[1].tool_calls[0].function`: list indices in
    brackets, and the names pydantic gives the members of a union (`str`, `list[...]`, `ToolChoice`,
    `literal['none',...]`) left out."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _UNION_MEMBER.match(part):
            out += f".{part}" if out else part
    return out or None


_UNION_MEMBER = re.compile(r"^(str|int|float|bool|none|dict\[.*|list\[.*|literal\[.*|function-.*|[A-Z]\w*)$")


class Admission:
    """Counts requests in the server; past `max_queued_requests` a new one gets 429 with Retry-After."""

    def __init__(self, limits: ServerLimits):
        self.limits, self.count = limits, 0

    def enter(self) -> None:
        if self.count >= self.limits.max_queued_requests:
            raise overloaded(self.limits.retry_after_s,
                             f"the server already holds {self.count} requests (its queue limit); retry later")
        self.count += 1

    def leave(self) -> None:
        self.count -= 1
