"""The OpenAI-compatible FastAPI app over one specstruct engine.

    app = create_app(engine, served_model_name="qwen2.5-coder-1.5b", api_key="secret")
    uvicorn.run(app, host="127.0.0.1", port=8000, **uvicorn_options(ServerLimits()))  # header size limits: http.py

Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health, GET /metrics.
The engine is reached only through its public API (`astream`, awaited on the event loop; `constraint`, `prompt_ids`;
GET /health also asks `engine.scheduler.problem()`); every request is a request to the engine's scheduler, which
batches them."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import anyio
import fastapi
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from specstruct.errors import IncompleteOutputError

from specstruct.serving.openai.assemble import Assembler
from specstruct.serving.openai.errors import APIError, from_exception, shutting_down
from specstruct.serving.openai.guard import Admission, authorize, parse, read_json
from specstruct.serving.openai.http import HeaderLimit
from specstruct.serving.openai.limits import ServerLimits
from specstruct.serving.openai.metrics import Metrics
from specstruct.serving.openai.protocol import ChatCompletionRequest, CompletionRequest
from specstruct.serving.openai.responses import DONE, Shape
from specstruct.serving.openai.runner import chunks, prepare
from specstruct.serving.openai.translate import EngineCall, chat_call, completion_call


class _Server:
    """The per-app state: engine, names, limits, metrics, admission, and the flag that stops live requests."""

    def __init__(self, engine: Any, name: str, api_key: str | None, limits: ServerLimits):
        self.engine, self.name, self.api_key, self.limits = engine, name, api_key, limits
        self.metrics, self.admission = Metrics(), Admission(limits)
        self.stopping = asyncio.Event()  # set when the server shuts down: live requests end with a 503 error

    # -- one request ------------------------------------------------------------------------------------
    async def handle(self, request: Request, chat: bool) -> Response:
        endpoint, started = ("chat" if chat else "completions"), time.perf_counter()
        admitted = streaming = False
        status = 200
        try:
            authorize(request, self.api_key)
            body = await read_json(request, self.limits)
            req = parse(ChatCompletionRequest if chat else CompletionRequest, body)
            if req.model != self.name:
                raise APIError(404, f"the model {req.model!r} does not exist here; this server serves {self.name!r} "
                               "(GET /v1/models)", param="model", code="model_not_found")  # OpenAI's status
            if not chat:
                call = completion_call(req, self.limits)
            elif req.tools:  # building the tools' grammar takes a while: never on the event loop
                call = await anyio.to_thread.run_sync(chat_call, req, self.limits, self.engine.tokenizer)
            else:
                call = chat_call(req, self.limits, self.engine.tokenizer)
            self.admission.enter()
            admitted = True
            self.metrics.in_flight.inc()
            await prepare(self.engine, call, self.limits)
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            shape = Shape(chat, self.name, include_usage=include_usage and req.stream)
            if req.stream:
                room = getattr(getattr(self.engine, "scheduler", None), "check_room", None)
                if room is not None:
                    room()  # overload is a 429 here; once the stream starts the status line says 200
                streaming = True
                return StreamingResponse(self._sse(call, shape, endpoint, started), media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            return JSONResponse(await self._complete(request, call, shape))
        except APIError as err:
            status = err.status
            return err.response()
        except Exception as exc:  # noqa: BLE001 - the HTTP boundary: an OpenAI error object, never a bare 500
            err = from_exception(exc, retry_after_s=self.limits.retry_after_s)
            status = err.status
            return err.response()
        except asyncio.CancelledError:  # the server shutting down (past its graceful timeout) cancels the request:
            status = 503  # say so in OpenAI's shape, retryable elsewhere, rather than uvicorn's plain-text 500
            return shutting_down().response()
        finally:
            if not streaming:
                self._done(admitted, endpoint, status, started)

    def _done(self, admitted: bool, endpoint: str, status: int, started: float) -> None:
        if admitted:
            self.admission.leave()
            self.metrics.in_flight.dec()
        self.metrics.finished(endpoint, status, time.perf_counter() - started)

    async def _run(self, call: EngineCall, asm: Assembler, sink: list) -> None:
        """Feed every chunk of the call through `asm` into `sink` (deltas), then its last deltas."""
        cut = None
        source = chunks(self.engine, call, self.limits, self.stopping)
        try:
            async for chunk in source:
                sink.extend(asm.feed(chunk))
        except IncompleteOutputError as e:
            cut = e
        finally:
            await source.aclose()
        sink.extend(asm.finish(cut))
        self.metrics.decoded(call.mode, asm.stats)

    async def _complete(self, request: Request, call: EngineCall, shape: Shape) -> dict[str, Any]:
        asm, deltas = Assembler(self.engine.tokenizer, call), []
        task = asyncio.ensure_future(self._run(call, asm, deltas))
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=0.25)
                if not task.done() and await request.is_disconnected():
                    raise APIError(499, "the client disconnected; the request was cancelled", code="cancelled")
            task.result()
        except Exception as exc:
            raise from_exception(exc, constraint_param=call.constraint_param, prompt_param=call.prompt_param) from exc
        finally:  # also on cancellation (shutdown): the generation stops at its next step
            task.cancel()
        return shape.body(deltas, asm.finish_reason, asm.stats)

    async def _sse(self, call: EngineCall, shape: Shape, endpoint: str, started: float):
        asm, status = Assembler(self.engine.tokenizer, call), 200
        source = chunks(self.engine, call, self.limits, self.stopping)
        first = True
        try:
            if shape.chat:
                yield shape.chunk({"role": "assistant", "content": ""})
            cut = None
            try:
                async for chunk in source:
                    if first:  # the engine's first token, whether or not it shows yet (a call is held until whole)
                        self.metrics.ttft.observe(time.perf_counter() - started)
                        first = False
                    for delta in asm.feed(chunk):
                        yield shape.chunk(delta)
            except IncompleteOutputError as e:
                cut = e
            for delta in asm.finish(cut):
                yield shape.chunk(delta)
            self.metrics.decoded(call.mode, asm.stats)
            yield shape.chunk({}, asm.finish_reason, asm.stats)
            if shape.include_usage:
                yield shape.usage_chunk(asm.stats)
            yield DONE
        except Exception as exc:  # noqa: BLE001 - mid-stream: an error event, then [DONE]
            err = from_exception(exc, constraint_param=call.constraint_param, prompt_param=call.prompt_param)
            status = err.status
            yield shape.error_chunk(err.body())
            yield DONE
        except (GeneratorExit, asyncio.CancelledError):  # the client went away (counted as _complete counts it)
            status = 499
            raise
        finally:  # also on client disconnect (the response task is cancelled): cancel the generation
            await source.aclose()
            self._done(True, endpoint, status, started)

    def stop_requests(self) -> None:
        """End every live request now, in OpenAI's shape: a 503 `shutting_down` error (an error event then [DONE] in a
        stream), their generations cancelled (GracefulServer calls this just before its graceful timeout)."""
        self.stopping.set()


def create_app(engine: Any, *, served_model_name: str, api_key: str | None = None,
               limits: ServerLimits | None = None) -> fastapi.FastAPI:
    """The OpenAI-compatible app serving `engine` under `served_model_name`. With `api_key`, every /v1 route and
    /metrics require `Authorization: Bearer <api_key>` (GET /health does not)."""
    server = _Server(engine, served_model_name, api_key, limits or ServerLimits())

    @contextlib.asynccontextmanager
    async def lifespan(_: fastapi.FastAPI):
        yield
        server.stop_requests()  # shutdown: running generations stop at their next step

    app = fastapi.FastAPI(title="specstruct", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.specstruct = server
    app.add_middleware(HeaderLimit, max_field_bytes=server.limits.max_header_field_bytes)  # before routing and keys

    @app.exception_handler(APIError)
    async def _api_error(_: Request, err: APIError) -> JSONResponse:
        return err.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, err: StarletteHTTPException) -> JSONResponse:  # unknown route, wrong method
        what = {404: "no such route", 405: "method not allowed"}.get(err.status_code, str(err.detail))
        return APIError(err.status_code, f"{what}: this server answers POST /v1/chat/completions, "
                        "POST /v1/completions, GET /v1/models, GET /health and GET /metrics",
                        code="not_found" if err.status_code == 404 else None, headers=err.headers).response()

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        return from_exception(exc).response()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await server.handle(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await server.handle(request, chat=False)

    card = {"id": served_model_name, "object": "model", "created": 0, "owned_by": "specstruct"}

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        authorize(request, api_key)
        return {"object": "list", "data": [card]}

    @app.get("/v1/models/{model_id:path}")  # client.models.retrieve(...)
    async def model(model_id: str, request: Request) -> dict[str, Any]:
        authorize(request, api_key)
        if model_id != served_model_name:
            raise APIError(404, f"the model {model_id!r} does not exist; this server serves {served_model_name!r}",
                           param="model", code="model_not_found")
        return card

    @app.get("/health")
    async def health() -> Any:  # 503 once the engine cannot serve, so a load balancer (or Ray) stops sending
        scheduler = getattr(engine, "scheduler", None)
        problem = scheduler.problem() if hasattr(scheduler, "problem") else None
        return JSONResponse({"status": "unavailable", "error": problem}, status_code=503) if problem else \
            {"status": "ok"}

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        authorize(request, api_key)
        return Response(server.metrics.scrape(engine), media_type=server.metrics.content_type)

    return app
