"""ChatSpecStruct: a LangChain chat model on a local transformers model, whose structured output and tool
calls are enforced while decoding (token masks) and sped up by grammar-aware speculative decoding."""

from __future__ import annotations

import asyncio

from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Iterator, Literal, Sequence

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import LanguageModelInput
from langchain_core.language_models.chat_models import BaseChatModel, LangSmithParams, generate_from_stream
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool

from langchain_specstruct._base import SpecStructParams, speculative_metadata, usage_metadata
from langchain_specstruct._messages import to_chat_messages
from langchain_specstruct._structured import structured_runnable
from langchain_specstruct._tools import (
    ToolCallStreamer,
    call_schema,
    cut_reply,
    parse_tool_calls,
    reply_text,
    select_tools,
    tool_grammar,
)
from specstruct.errors import IncompleteOutputError, ValidationRetryError


@dataclass
class _Request:
    """One call, resolved: which engine, what prompt, which output type, which run keywords."""

    engine: Any
    prompt: list[dict[str, Any]]
    output_type: Any
    run_kwargs: dict[str, Any]
    tools: list[dict[str, Any]] | None
    model_name: str
    calls: bool = False  # the reply may hold calls to parse (tools bound, tool_choice not "none")


class ChatSpecStruct(SpecStructParams, BaseChatModel):
    """Chat model over a local Hugging Face model through specstruct.

    Construction is free; the weights load on first use and are shared by every instance with the same
    (model, draft_model, device, dtype).

    ```python
    from langchain_specstruct import ChatSpecStruct

    llm = ChatSpecStruct(model="qwen2.5-coder-1.5b", draft_model="qwen2.5-coder-0.5b", max_tokens=256)
    llm.invoke("Name three prime numbers.")

    class Person(BaseModel):
        name: str
        age: int

    llm.with_structured_output(Person).invoke("Ada Lovelace died at 36.")  # -> Person, valid by construction

    llm.bind_tools([get_weather], tool_choice="any").invoke("Weather in Paris?").tool_calls
    ```
    `response_metadata["speculative"]` holds the decoding statistics (acceptance rate, tokens per forward).
    """

    @property
    def _llm_type(self) -> str:
        return "specstruct-chat"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model": self.model, "draft_model": self.draft_model, "temperature": self.temperature,
                "max_tokens": self.max_tokens, "enable_speculative": self.enable_speculative}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = LangSmithParams(ls_provider="specstruct", ls_model_type="chat",
                                 ls_model_name=kwargs.get("model") or self.model)
        temperature = kwargs.get("temperature", self.temperature)
        params["ls_temperature"] = 0.0 if temperature is None else float(temperature)
        if (max_tokens := kwargs.get("max_tokens", self.max_tokens)) is not None:
            params["ls_max_tokens"] = max_tokens
        if stop or self.stop:
            params["ls_stop"] = stop or self.stop
        return params

    # -- tools and structured output ---------------------------------------------------------------
    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable | BaseTool],
        *,
        tool_choice: dict | str | bool | None = None,
        parallel_tool_calls: bool | None = None,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools (Pydantic classes, functions, BaseTools, dicts). tool_choice: "auto" (default: text or
        calls), "any"/"required" (one or more calls), a tool name (a call of that tool), "none" (text).
        `parallel_tool_calls=False` allows one call only. `strict` is accepted; decoding is always strict."""
        formatted = [convert_to_openai_tool(t) for t in tools]
        select_tools(formatted, tool_choice)  # fail now, not at the first call, on an unknown tool name
        call_schema(formatted)  # ... or on parameters no grammar can guarantee (ConstraintError naming tool and keyword)
        return self.bind(tools=formatted, tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls,
                         **kwargs)

    def with_structured_output(
        self,
        schema: dict[str, Any] | type | None = None,
        *,
        method: Literal["json_schema", "function_calling", "json_mode"] = "json_schema",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, Any]:
        """A runnable whose output is `schema`, enforced while decoding (see `_structured.py`). Pydantic
        classes give instances, TypedDict/JSON schema give dicts; include_raw=True gives
        {"raw", "parsed", "parsing_error"}."""
        if kwargs:
            raise ValueError(f"Unsupported with_structured_output arguments: {sorted(kwargs)}")
        return structured_runnable(self, schema, method, include_raw, strict)

    # -- one call ------------------------------------------------------------------------------------
    def _request(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]) -> _Request:
        model = kwargs.get("model") if isinstance(kwargs.get("model"), str) else None
        engine = self._engine(model)
        tools, response_format = kwargs.get("tools"), kwargs.get("response_format")
        if tools and response_format:
            raise ValueError("Pass either tools (bind_tools) or a response format (with_structured_output), "
                             "not both in one call.")
        output_type: Any = None
        if response_format:
            output_type = kwargs.get("output_type") or response_format
        elif tools:
            import specstruct as ss

            output_type = ss.Grammar(tool_grammar(tools, kwargs.get("tool_choice"), engine.tokenizer,
                                                  parallel=kwargs.get("parallel_tool_calls") is not False),
                                     instruction="")  # the chat template describes the tools; never the grammar
        run_kwargs = self._run_kwargs(engine, stop if output_type is None or tools else None, kwargs)
        if output_type is not None and not tools:
            run_kwargs["stop"] = None  # stop strings would cut a structured reply short
        # (with tools they apply, as ChatOpenAI's do: a text reply ends there; a call they cut is reported cut)
        if tools:
            run_kwargs["tools"] = tools
        return _Request(engine, to_chat_messages(messages), output_type, run_kwargs, tools or None,
                        model or self._model_name(engine),
                        calls=bool(tools) and kwargs.get("tool_choice") not in ("none", False))  # "none": text only

    def _reply_text(self, req: _Request, result: Any) -> str:
        """The reply text; with tools, `<tool_call>` markers kept where decoding hides them (specstruct.constraints.tools.grammar)."""
        return reply_text(req.engine.tokenizer, result.text, result.token_ids, req.tools)

    def _metadata(self, req: _Request, result: Any, has_calls: bool) -> dict[str, Any]:
        return {"model_name": req.model_name, "model_provider": "specstruct",
                "finish_reason": "tool_calls" if has_calls else result.finish_reason,
                "speculative": speculative_metadata(result.stats)}

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        if self.streaming or kwargs.get("stream"):
            return generate_from_stream(self._stream(messages, stop, run_manager, **kwargs))
        req = self._request(messages, stop, kwargs)
        try:
            result = req.engine.run(req.prompt, req.output_type, **req.run_kwargs)
        except (IncompleteOutputError, ValidationRetryError) as err:
            return self._chat_result(req, None, err)
        return self._chat_result(req, result)

    def _chat_result(self, req: _Request, result: Any, err: Exception | None = None) -> ChatResult:
        if isinstance(err, IncompleteOutputError):
            return ChatResult(generations=[ChatGeneration(message=self._truncated_text(req, err))])
        if isinstance(err, ValidationRetryError):
            return ChatResult(generations=[ChatGeneration(message=self._failed_validation(req, err))])
        text = self._reply_text(req, result)
        content, calls = parse_tool_calls(text) if req.calls else (text, [])
        message = AIMessage(content=content, tool_calls=calls, usage_metadata=usage_metadata(result.stats),
                            response_metadata=self._metadata(req, result, bool(calls)))
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _failed_validation(self, req: _Request, err: ValidationRetryError) -> AIMessage:
        """Every retry failed validation (a Pydantic validator the grammar cannot express): return the last
        attempt as the reply, so LangChain's parser reports the error (`parsing_error` with include_raw)."""
        last = err.attempts[-1] if err.attempts else {"text": "", "error": str(err)}
        meta = {"model_name": req.model_name, "model_provider": "specstruct", "finish_reason": "stop",
                "validation_errors": [str(a.get("error")) for a in err.attempts]}
        stats = last.get("stats")
        if stats is not None:
            meta["speculative"] = speculative_metadata(stats)
        return AIMessage(content=last.get("text", ""), response_metadata=meta,
                         usage_metadata=usage_metadata(stats) if stats is not None else None)

    def _truncated_text(self, req: _Request, err: IncompleteOutputError) -> AIMessage:
        """With tools bound, a reply cut by max_tokens is a "length" finish, as ChatOpenAI reports it: cut text is
        the content, a cut call goes to `invalid_tool_calls` with its arguments as far as written."""
        if not req.tools or req.output_type is None:
            raise err
        meta = {"model_name": req.model_name, "model_provider": "specstruct", "finish_reason": err.reason}
        usage = usage_metadata(err.stats) if err.stats is not None else None
        text = self._reply_text(req, err) if err.token_ids else err.text
        content, calls, invalid = cut_reply(text) if req.calls else (text, [], [])
        return AIMessage(content=content, tool_calls=calls, invalid_tool_calls=invalid, response_metadata=meta,
                         usage_metadata=usage)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        req = self._request(messages, stop, kwargs)
        chunks = _Chunks(self, req)
        try:
            for chunk in req.engine.stream(req.prompt, req.output_type, **req.run_kwargs):
                if (gen := chunks.feed(chunk)) is not None:
                    if run_manager:
                        run_manager.on_llm_new_token(gen.text, chunk=gen)
                    yield gen
        except IncompleteOutputError as err:
            chunks.cut(err)
        except ValidationRetryError as err:  # the text was streamed already; the parser reports the error
            chunks.invalid(err)
        gen, tell = chunks.last()
        if run_manager and tell:
            run_manager.on_llm_new_token(gen.text, chunk=gen)
        yield gen

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        if self.streaming or kwargs.get("stream"):
            chunks = [c async for c in self._astream(messages, stop, run_manager, **kwargs)]
            return generate_from_stream(iter(chunks))
        req = await asyncio.to_thread(self._request, messages, stop, kwargs)  # a first call loads the model
        try:  # awaits the engine's scheduler directly: concurrent calls share its batches
            result = await req.engine.arun(req.prompt, req.output_type, **req.run_kwargs)
        except (IncompleteOutputError, ValidationRetryError) as err:
            return self._chat_result(req, None, err)
        return self._chat_result(req, result)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        """`_stream` awaited on the event loop: the engine's astream is a request to its scheduler like any other."""
        req = await asyncio.to_thread(self._request, messages, stop, kwargs)  # a first call loads the model
        chunks = _Chunks(self, req)
        try:
            async for chunk in req.engine.astream(req.prompt, req.output_type, **req.run_kwargs):
                if (gen := chunks.feed(chunk)) is not None:
                    if run_manager:
                        await run_manager.on_llm_new_token(gen.text, chunk=gen)
                    yield gen
        except IncompleteOutputError as err:
            chunks.cut(err)
        except ValidationRetryError as err:
            chunks.invalid(err)
        gen, tell = chunks.last()
        if run_manager and tell:
            await run_manager.on_llm_new_token(gen.text, chunk=gen)
        yield gen


class _Chunks:
    """A stream's engine chunks -> LangChain chunks (text, tool-call chunks, then a last chunk with usage and
    metadata), the same for `_stream` and `_astream`."""

    def __init__(self, chat: ChatSpecStruct, req: _Request):
        self.chat, self.req = chat, req
        self.streamer = ToolCallStreamer() if req.calls else None
        self.result: Any = None
        self.truncated: AIMessage | None = None
        self.seen = self.rest = ""

    def feed(self, chunk: Any) -> ChatGenerationChunk | None:
        self.result, self.seen = chunk.result or self.result, self.seen + chunk.text
        text, calls = self.streamer.feed(chunk.text) if self.streamer else (chunk.text, [])
        if not (text or calls):
            return None
        return ChatGenerationChunk(message=AIMessageChunk(content=text, tool_call_chunks=calls))

    def cut(self, err: IncompleteOutputError) -> None:
        self.truncated = self.chat._truncated_text(self.req, err)
        self.rest = err.text[len(self.seen):] if err.text.startswith(self.seen) else ""  # text still held back

    def invalid(self, err: ValidationRetryError) -> None:
        self.truncated = self.chat._failed_validation(self.req, err)

    def last(self) -> tuple[ChatGenerationChunk, bool]:
        """The last chunk, and whether callbacks hear of it (not for a cut or failed reply)."""
        streamer, req = self.streamer, self.req
        if self.truncated is not None:  # a cut call goes out as its chunk, with the text it had as arguments
            text, done = streamer.feed(self.rest) if streamer else (self.rest, [])
            tail, late, cut = streamer.cut_short() if streamer else ("", [], [])
            last = AIMessageChunk(content=text + tail, tool_call_chunks=done + late + cut, chunk_position="last",
                                  usage_metadata=self.truncated.usage_metadata,
                                  response_metadata=self.truncated.response_metadata)
            return ChatGenerationChunk(message=last), False
        result = self.result
        if result is None:
            raise RuntimeError("specstruct's stream ended without a final result; this is a bug in specstruct.")
        tail, late = "", []
        if streamer:
            tail, late = streamer.finish()
            if not streamer.calls:  # markers hidden from streamed text (special tokens): parse the tokens
                content, calls = parse_tool_calls(self.chat._reply_text(req, result))
                if calls:
                    tail, late = "", [streamer._chunk(c) for c in calls]
        last = AIMessageChunk(content=tail, tool_call_chunks=late, usage_metadata=usage_metadata(result.stats),
                              response_metadata=self.chat._metadata(req, result,
                                                                    bool(streamer and (streamer.calls or late))),
                              chunk_position="last")
        return ChatGenerationChunk(message=last), True
