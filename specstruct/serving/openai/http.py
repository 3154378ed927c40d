"""The HTTP parser the server runs under, chosen for its request-header limits.

uvicorn's httptools parser reads a request head of any size before the app sees it (a 128 MB header held the event
loop for seconds); h11 stops buffering a head at `h11_max_incomplete_event_size` bytes. So the server runs on h11
with that set to `max_header_bytes`: past it the connection gets a 431 "Request Header Fields Too Large" naming the
limit and is closed (after a lingering read: see HeaderLimitedH11._linger), before routing, the API key or the body are looked at. One header line (name and value) past
`max_header_field_bytes` gets the same 431 from `HeaderLimit`, the outermost ASGI middleware.

    uvicorn.Config(app, **uvicorn_options(limits))
"""

from __future__ import annotations

import json
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from specstruct.serving.openai.limits import ServerLimits


def uvicorn_options(limits: ServerLimits) -> dict[str, Any]:
    """The uvicorn.Config keywords that enforce `limits.max_header_bytes`."""
    return {"http": HeaderLimitedH11, "h11_max_incomplete_event_size": limits.max_header_bytes}


def too_large_body(message: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": "request_header_fields_too_large"}}).encode()


LINGER_S, LINGER_IDLE_S = 5.0, 1.0  # after a 431: drop what the client still sends, this long at most / once idle


class _Connection(h11.Connection):
    """h11's connection, remembering the last protocol error it raised (its `error_status_hint` says 431 when the
    head outgrew the limit)."""

    last_error: h11.RemoteProtocolError | None = None

    def next_event(self) -> Any:
        try:
            return super().next_event()
        except h11.RemoteProtocolError as e:
            self.last_error = e
            raise


class HeaderLimitedH11(H11Protocol):
    """uvicorn's h11 protocol, answering a request head past `h11_max_incomplete_event_size` with a 431 (OpenAI's
    error shape) instead of h11's plain 400."""

    lingering = False  # a 431 was sent: what arrives now is dropped (see _linger)

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.limit = config.h11_max_incomplete_event_size
        self.conn = _Connection(h11.SERVER, self.limit)

    def send_400_response(self, msg: str) -> None:
        error = self.conn.last_error
        if error is None or error.error_status_hint != 431:
            return super().send_400_response(msg)
        body = too_large_body(f"the request's headers are over this server's limit of {self.limit} bytes "
                              "(specstruct serve --max-header-bytes); send smaller headers")
        self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
                             b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        self._linger()

    def _linger(self) -> None:
        """A lingering close (nginx's): the answer sent and our side shut, what the client still sends is read and
        dropped until it stops (LINGER_IDLE_S) or LINGER_S pass. Closing at once would reset the connection while a
        client that sends its whole request before reading is still sending, and the reset discards the 431
        before that client reads it."""
        self.lingering = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        deadline = self.loop.time() + LINGER_S
        self._linger_idle = self.loop.call_later(LINGER_IDLE_S, self.transport.close)
        self._linger_deadline = self.loop.call_at(deadline, self.transport.close)

    def data_received(self, data: bytes) -> None:
        if not self.lingering:
            return super().data_received(data)
        self._linger_idle.cancel()  # dropped unread; the client is still sending
        self._linger_idle = self.loop.call_later(LINGER_IDLE_S, self.transport.close)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.lingering:
            self._linger_idle.cancel()
            self._linger_deadline.cancel()
        super().connection_lost(exc)


class HeaderLimit:
    """ASGI middleware: a request with one header (name and value) longer than `max_field_bytes` gets a 431 before
    anything else reads it."""

    def __init__(self, app: Any, max_field_bytes: int):
        self.app, self.max_field_bytes = app, max_field_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            for name, value in scope.get("headers", ()):
                if len(name) + len(value) > self.max_field_bytes:
                    body = too_large_body(
                        f"the header {name[:64].decode('latin-1')!r} is {len(name) + len(value)} bytes, over this "
                        f"server's limit of {self.max_field_bytes} bytes for one header (specstruct serve "
                        "--max-header-field-bytes); send a smaller one")
                    await send({"type": "http.response.start", "status": 431,
                                "headers": [(b"content-type", b"application/json"),
                                            (b"content-length", str(len(body)).encode())]})
                    await send({"type": "http.response.body", "body": body})
                    return
        await self.app(scope, receive, send)
