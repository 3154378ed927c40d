"""The asyncio calls of SpecStruct: `arun`, `agenerate`, `astream`. They await the scheduler directly (no
thread per call); a cancelled task, a `timeout=` or an abandoned `astream` cancels its request."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

from specstruct.api.output import deadline
from specstruct.results import Chunk, Result

CONFIG_KEYS = ("max_new_tokens", "temperature", "top_p", "seed", "stop", "cache_salt")  # run()'s per-call keys


class AsyncCalls:
    """Mixed into SpecStruct (which provides scheduler, _config, _attempts and _stream_job)."""

    async def arun(self, prompt: Any, output_type: Any = None, *, system: str | None = None,
                   tools: list[dict] | None = None, config: Any = None, timeout: float | None = None,
                   tool_choice: Any = None, **overrides: Any) -> Result:
        """`run` for asyncio (same arguments): `result = await engine.arun(prompt, Person)`."""
        if unknown := set(overrides) - set(CONFIG_KEYS):
            raise TypeError(f"arun() got unexpected keyword arguments {sorted(unknown)}")
        plan = self._attempts(prompt, output_type, system, tools, self._config(config, **overrides), tool_choice)
        loop, until = asyncio.get_running_loop(), deadline(timeout)
        job = await loop.run_in_executor(None, next, plan)  # compiling a schema may take a while: not on the loop
        while True:
            req = self.scheduler.submit(*job, loop=loop)
            try:
                row = await req.aresult(until)
            finally:
                req.cancel()  # a no-op once finished; frees the slot when the task was cancelled
            try:
                job = plan.send(row)
            except StopIteration as done:
                return done.value

    async def agenerate(self, prompt: Any, output_type: Any = None, **kwargs: Any) -> Any:
        """`generate` for asyncio: the validated value."""
        return (await self.arun(prompt, output_type, **kwargs)).value

    async def astream(self, prompt: Any, output_type: Any = None, *, system: str | None = None,
                      tools: list[dict] | None = None, config: Any = None, timeout: float | None = None,
                      tool_choice: Any = None, **overrides: Any) -> AsyncIterator[Chunk]:
        """`stream` for asyncio: `async for chunk in engine.astream(prompt, Person): ...`."""
        loop, until = asyncio.get_running_loop(), deadline(timeout)
        cfg = self._config(config, **overrides)
        chunks, job = await loop.run_in_executor(None, self._stream_job, prompt, output_type, system, tools, cfg,
                                                 tool_choice)
        req = self.scheduler.submit(*job, loop=loop)
        try:
            async for new in req.atokens(until):
                if (chunk := chunks.push(new)) is not None:
                    yield chunk
        finally:
            req.cancel()
        yield chunks.final(req.row)
