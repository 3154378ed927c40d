"""A real uvicorn server in a background thread on 127.0.0.1 with an ephemeral port, serving a tiny engine."""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from typing import Any, Iterator

MODEL = "tiny"
KEY = "test-key"


@contextlib.contextmanager
def running(app: Any) -> Iterator[str]:
    """Serve `app` until the block ends; yields the base URL (`http://127.0.0.1:PORT/v1`)."""
    import uvicorn

    from specstruct.serving.openai import uvicorn_options

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           timeout_graceful_shutdown=2,
                                           **uvicorn_options(app.state.specstruct.limits)))  # as `specstruct serve`
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(10)


@functools.lru_cache(maxsize=2)
def tiny_engine(markers: bool = False, max_new_tokens: int = 40) -> Any:
    """One engine per kind for the whole session (the app never mutates it)."""
    import copy

    import specstruct as ss
    from specstruct.testing import perturbed, tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    if markers:  # Qwen2.5's situation: the call markers are added tokens
        tok = copy.deepcopy(tok)
        tok.add_tokens(["<tool_call>", "</tool_call>"])
    model = tiny_model(tok, seed=0)
    draft = None if markers else perturbed(model)
    return ss.SpecStruct(model, tok, draft_model=draft, config=ss.SpecConfig(max_new_tokens=max_new_tokens),
                         model_name=MODEL)
