"""Running one EngineCall from the event loop: validate it (constraint compiles, prompt fits) and iterate its
stream chunks, cancelling the generation when the consumer goes away (client disconnect, timeout, shutdown).

Uses the engine's own `astream` when it has one (the batched scheduler); otherwise runs the blocking
`engine.stream` generator in a worker thread and closes it at the next chunk after cancellation."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, AsyncIterator

import anyio

from specstruct.serving.openai.errors import NO_RETRY, APIError, bad_request, from_exception, shutting_down
from specstruct.serving.openai.limits import ServerLimits
from specstruct.serving.openai.translate import EngineCall

_DONE = object()


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


async def _thread_stream(engine: Any, call: EngineCall, cancel: threading.Event) -> AsyncIterator[Any]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()

    def put(item: Any) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody listens any more
            cancel.set()

    def produce() -> None:
        iterator = None
        try:
            iterator = engine.stream(call.prompt, call.output_type, tools=call.tools, **call.kwargs)
            for chunk in iterator:
                if cancel.is_set():
                    break
                put(chunk)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the consumer
            put(exc)
        finally:
            if iterator is not None:
                iterator.close()  # releases the engine (GeneratorExit inside its decode loop)
            put(_DONE)

    threading.Thread(target=produce, name="specstruct-request", daemon=True).start()
    while True:
        item = await queue.get()
        if item is _DONE:
            return
        if isinstance(item, BaseException):
            raise item
        yield item


async def chunks(engine: Any, call: EngineCall, limits: ServerLimits, cancel: threading.Event,
                 stopping: asyncio.Event | None = None) -> AsyncIterator[Any]:
    """The call's `ss.Chunk`s; engine errors surface as the original exceptions (IncompleteOutputError included).
    Past `limits.request_timeout_s` raises APIError(504); once `stopping` is set (the server is shutting down),
    APIError(503). Closing this generator cancels the generation."""
    astream = getattr(engine, "astream", None)
    source = (astream(call.prompt, call.output_type, tools=call.tools, **call.kwargs) if astream is not None
              else _thread_stream(engine, call, cancel))
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
        cancel.set()
        if step is not None and not step.done():  # we were cancelled (the client left) while the source ran:
            step.cancel()  # it unwinds in its own task, closing the source; aclose now would find it running
        else:
            await source.aclose()


def loop_time() -> float:
    return asyncio.get_running_loop().time()
