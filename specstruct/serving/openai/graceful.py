"""A uvicorn.Server that ends live requests in OpenAI's shape before its graceful-shutdown timeout cuts them.

On SIGINT / SIGTERM uvicorn stops accepting, waits `timeout_graceful_shutdown` seconds for running requests, then
cancels what is left: a response still streaming then loses its connection mid-body (no error event, no [DONE];
the client sees an incomplete chunked read that does not say why). This server asks the app (`create_app`'s
state) to end them itself STOP_MARGIN_S before that: a stream gets an error event (503, code "shutting_down", retry
elsewhere) and [DONE], a plain request a 503, and every generation is cancelled. `specstruct serve` runs it; so can anyone:

    GracefulServer(uvicorn.Config(app, timeout_graceful_shutdown=30)).run()
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn

STOP_MARGIN_S = 0.5  # time the ended requests get to send their last events before uvicorn's timeout


class GracefulServer(uvicorn.Server):
    async def shutdown(self, sockets: Any = None) -> None:
        grace = self.config.timeout_graceful_shutdown
        state = getattr(getattr(self.config.app, "state", None), "specstruct", None)  # create_app's, if it is one
        later = None
        if grace is not None and state is not None:
            later = asyncio.get_running_loop().call_later(max(0.0, grace - STOP_MARGIN_S), state.stop_requests)
        try:
            await super().shutdown(sockets)
        finally:
            if later is not None:
                later.cancel()
