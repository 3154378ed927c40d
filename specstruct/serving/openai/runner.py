"""Running one EngineCall from the event loop: validate it (constraint compiles, prompt fits) and iterate its
stream chunks (`engine.astream`: awaited on the loop, no thread per request), cancelling the generation when the
consumer goes away (client disconnect, timeout, shutdown)."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import anyio

from specstruct.serving.openai.errors import NO_RETRY, APIError, bad_request, from_exception, shutting_down
from specstruct.serving.openai.limits import ServerLimits
from specstruct.serving.openai.translate import EngineCall



async def prepare(engine: Any, call: EngineCall, limits: ServerLimits) -> int:
    """Compile the constraint and count the prompt's tokens (off the event loop); 400 for what cannot run.
    Returns the prompt length in tokens."""

    def check() -> int:
        engine.constraint(call.output_type)  # a schema / regex / grammar that cannot be guaranteed -> 400
        window = getattr(getattr(engine, "runtime", None), "max_length", None)
        if call.fit_default and window:  # as OpenAI and vLLM: no max_tokens sent, so up to what the window leaves
            n = len(engine.prompt_ids(call.prompt, call.output_type, tools=call.tools, max_new_tokens=1))
            call.kwargs["max_new_tokens"] = max(1, min(call.max_new_tokens, window - n))
        ids = engine.prompt_ids(call.prompt, call.output_type, tools=call.tools, max_new_tokens=call.max_new_tokens)
        return len(ids)

    try:
        n = await anyio.to_thread.run_sync(check)
    except Exception as exc:  # noqa: BLE001 - mapped to an OpenAI error object
        raise from_exception(exc, constraint_param=call.constraint_param, prompt_param=call.prompt_param) from exc
    if limits.max_prompt_tokens is not None and n > limits.max_prompt_tokens:
        raise bad_request(f"the prompt has {n} tokens, over this server's limit of {limits.max_prompt_tokens}; "
                          "shorten it", "messages", "context_length_exceeded")
    return n


async def chunks(engine: Any, call: EngineCall, limits: ServerLimits,
                 stopping: asyncio.Event | None = None) -> AsyncIterator[Any]:
    """The call's `ss.Chunk`s; engine errors surface as the original exceptions (IncompleteOutputError included).
    Past `limits.request_timeout_s` raises APIError(504); once `stopping` is set (the server is shutting down),
    APIError(503). Closing this generator cancels the generation."""
    source = engine.astream(call.prompt, call.output_type, tools=call.tools, **call.kwargs)
    deadline = loop_time() + limits.request_timeout_s
    stop = asyncio.ensure_future(stopping.wait()) if stopping is not None else None
    step = None
    try:
        while True:
            step = asyncio.ensure_future(source.__anext__())
            waits = {step} if stop is None else {step, stop}
            await asyncio.wait(waits, timeout=max(0.0, deadline - loop_time()), return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                step.cancel()  # the generation stops (GeneratorExit / cancellation inside the engine's stream)
                await asyncio.gather(step, return_exceptions=True)
                if stop is not None and stop.done():
                    raise shutting_down()
                raise APIError(504, f"the request ran past this server's timeout of {limits.request_timeout_s:g} s "
                                    "and was cancelled; ask for fewer tokens", type="timeout_error",
                               code="timeout", headers=NO_RETRY)  # a retry would run it as long again
            try:
                chunk = step.result()
            except StopAsyncIteration:
                return
            yield chunk
    finally:
        if stop is not None:
            stop.cancel()
        if step is not None and not step.done():  # we were cancelled (the client left) while the source ran:
            step.cancel()  # it unwinds in its own task, closing the source; aclose now would find it running
        else:
            await source.aclose()


def loop_time() -> float:
    return asyncio.get_running_loop().time()
