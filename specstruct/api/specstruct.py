"""SpecStruct: the public entry point.

    engine = SpecStruct.from_pretrained("qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b")
    person = engine.generate("Extract: Ada Lovelace, 36.", Person)      # -> Person
"""

from __future__ import annotations

import asyncio
import threading
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, AsyncIterator, Generator, Iterator, Sequence, TypeVar, overload

import torch

from specstruct.config import BatchConfig, EngineConfig, SpecConfig, split_params
from specstruct.constraints import Constraint, compile_constraint, prepare
from specstruct.runtime.openmp import release_pool, releasing
from specstruct.models.loading import output_rows
from specstruct.engine.core import build as build_engine
from specstruct.engine.request import Output
from specstruct.engine.scheduler import DecoderFactory
from specstruct.spec.interfaces import Runtime
from specstruct.spec.speculator import Speculator
from specstruct.errors import IncompleteOutputError, InvalidPromptError, ValidationRetryError
from specstruct.types.output import OutputSpec, resolve
from specstruct.results import Chunk, Result
from specstruct.runtime.load_memory import collect_and_trim, trim_heap
from specstruct.runtime.owned import hand_over, own
from specstruct.api.output import RETRYABLE, Ending, StreamChunks, deadline, final_text
from specstruct.api.inputs import (Message, RawPrompt, Tool, check_models, check_prompt, check_system, eos_token_ids, resolve_device,
                                   too_long)
from specstruct.api.prompt_ids import chat_ids
from specstruct.api.signature import checked_keywords
from specstruct.api.tool_replies import ToolReply, reply_spec

T = TypeVar("T")
Prompt = str | Sequence[Message] | RawPrompt


@dataclass(frozen=True)
class Call:
    """What one call asks for, checked: run, stream, arun and astream take the same keywords and make one of these
    (`config` is the engine's config with the call's keys merged in)."""

    prompt: Prompt
    output_type: object
    system: str | None
    tools: list[Tool] | None
    tool_choice: object
    config: SpecConfig
    timeout: float | None


def _prepare(tokenizer: Any, vocab_size: int) -> None:
    try:
        prepare(tokenizer, vocab_size)
    except Exception:  # e.g. a tokenizer llguidance cannot read: the first constrained request raises it, with the fix
        pass


class SpecStruct:
    """A target model (and optionally a draft model) that generates constrained output, speculatively."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, draft_model: torch.nn.Module | None = None,
                 config: SpecConfig | None = None, *, draft_tokenizer: Any = None, model_name: str | None = None,
                 engine_config: EngineConfig | dict[str, object] | None = None,
                 batch_config: BatchConfig | dict[str, object] | None = None, decoder: DecoderFactory | None = None,
                 target: Runtime | None = None):
        check_models(model, draft_model)
        self.config = config or SpecConfig()  # every call's default (a call's config= and keywords go over it)
        self.engine_config = EngineConfig.of(engine_config)
        self.model, self.tokenizer, self.draft_model = model, tokenizer, draft_model
        self.model_name = model_name or getattr(model.config, "_name_or_path", None) or type(model).__name__
        if draft_model is not None:
            from specstruct.models.loading import matched_draft

            # its own module (a structural copy of a user's): a GGUF draft's LM head may be wrapped in place
            draft_model = matched_draft(  # type: ignore[no-untyped-call]
                tokenizer, draft_tokenizer or tokenizer, model, own(draft_model))
        self.eos_token_ids = eos_token_ids(tokenizer, model)
        self.batch_config = batch_config if isinstance(batch_config, BatchConfig) else BatchConfig(**(batch_config or {}))
        # one thread owns the models; every call is a request to its scheduler (`decoder`, `target`: test doubles)
        self.core = build_engine(model, tokenizer, self.eos_token_ids, draft_model, self.config, self.engine_config,
                                 self.batch_config, decoder=decoder, target=target)
        self.speculator, self.scheduler = self.core.speculator, self.core.scheduler
        self.runtime, self.draft_model, self.numerics = self.speculator.target, self.core.draft_model, self.core.numerics
        self.prefix_cache, self.kv_store = self.core.prefix_cache, self.core.kv_store
        self._finalizer = weakref.finalize(self, self.core.close)  # spill files go with the engine, not at exit
        trim_heap()  # loading freed float32 copies (the draft's, before int8) in pieces glibc would keep
        release_pool()  # loading ran OpenMP regions here; the scheduler's thread computes from now on (openmp.py)

    @property
    def engine(self) -> Speculator:
        """Deprecated name of `speculator` (the model pair, proposers and policy)."""
        warnings.warn("SpecStruct.engine is now SpecStruct.speculator (its engine is SpecStruct.core)",
                      DeprecationWarning, stacklevel=2)
        return self.speculator

    @classmethod
    def from_pretrained(cls, model: str, draft: str | None = None, *, config: SpecConfig | None = None,
                        engine_config: EngineConfig | dict[str, object] | None = None,
                        decoding_params: dict[str, object] | None = None,
                        batch_config: BatchConfig | dict[str, object] | None = None) -> "SpecStruct":
        """Load a registry name (`qwen2.5-coder-1.5b`), hub id, local folder or .gguf file (a bare one: config,
        tokenizer and chat template come from its metadata), plus an optional draft model with the same vocabulary
        (the same forms, or "auto": a pulled registry draft whose vocabulary is the target's, else none). `config`
        is every call's default SpecConfig, `engine_config` what the engine is built with (weights, device, dtype,
        draft numerics, KV memory); `decoding_params` is a flat dict of keys of either (over both), `batch_config`
        the keys of BatchConfig (max_batch_size, timeout_ms, fill_strategy, max_queue); every key:
        docs/settings.md."""
        from specstruct.runtime.gguf_model import load_model

        engine_keys, call_keys = split_params(decoding_params)
        config = (config or SpecConfig()).merged(**call_keys)
        built = EngineConfig.of(engine_config)
        built = EngineConfig.of({**built.model_dump(), **engine_keys}) if engine_keys else built
        device = resolve_device(built.device)
        dtype = getattr(torch, built.dtype) if built.dtype != "auto" else torch.float32
        target, tokenizer = load_model(model, weights=built.weights, device=device, dtype=dtype)
        # the tokenizer's tables every constraint shares (about a second), built while the draft loads rather than
        # by the first constrained request; the thread only reads the tokenizer
        tables = threading.Thread(target=releasing(_prepare), args=(tokenizer, output_rows(target)), daemon=True)
        tables.start()
        draft = draft or built.draft_model_path
        if draft == "auto":  # a pulled registry draft with the target's vocabulary, or none
            from specstruct.models.loading import matching_draft

            draft = matching_draft(tokenizer, target)
        draft_model = draft_tok = None
        try:
            if draft:
                from specstruct.models.loading import same_tokenizer_files

                shared = tokenizer if same_tokenizer_files(model, draft) else None  # one tokenizer object for both
                draft_model, draft_tok = load_model(draft, weights=built.weights, device=device, dtype=dtype,
                                                    tokenizer=shared)
        finally:
            tables.join()  # before the engine times a draft step (Speculator): nothing else running
        hand_over(target, draft_model)  # loaded for this engine alone: switched in place, one copy of the weights
        engine = cls(target, tokenizer, draft_model, config, draft_tokenizer=draft_tok, model_name=str(model),
                     engine_config=built, batch_config=batch_config)
        del target, draft_model  # the engine keeps an int8 copy of the draft: free the float32 one (a reference
        collect_and_trim()       # cycle) now, and give its heap back to the system (bench.load_memory)
        return engine

    # -- building blocks ----------------------------------------------------------------------------------------
    def constraint(self, output_type: object = None) -> Constraint:
        """The compiled constraint for an output type, over this engine's tokenizer (cached)."""
        return self._compile(resolve(output_type))

    def _compile(self, spec: OutputSpec) -> Constraint:
        try:
            constraint: Constraint = compile_constraint(spec.spec, self.tokenizer, vocab_size=self.runtime.vocab_size,
                                                        eos_token_ids=self.eos_token_ids)
            return constraint
        finally:
            release_pool()  # building token tables ran OpenMP regions on this thread (a server's worker thread)

    def messages(self, prompt: Prompt, output_type: object = None, *, system: str | None = None
                 ) -> list[Message] | RawPrompt:
        """The chat messages a call sends: the prompt plus a system instruction naming the output's schema (a
        RawPrompt as it is)."""
        return self._messages(prompt, resolve(output_type), system)

    def prompt_ids(self, prompt: Prompt, output_type: object = None, *, system: str | None = None,
                   tools: list[Tool] | None = None, max_new_tokens: int | None = None) -> list[int]:
        """The exact prompt token ids a call sends to the model (chat template applied)."""
        return self._encode(self.messages(prompt, output_type, system=system), tools,
                            max_new_tokens or self.config.max_new_tokens)

    def _messages(self, prompt: Prompt, spec: OutputSpec, system: str | None) -> list[Message]:
        messages = check_prompt(prompt)
        check_system(system)
        if isinstance(messages, RawPrompt):
            if system:
                raise InvalidPromptError("system= needs chat messages: a RawPrompt is continued as written, so put "
                                         "that text into it, or pass messages")
            return messages  # type: ignore[return-value]
        instruction = "\n\n".join(s for s in (system, spec.instruction) if s)
        if instruction:
            if messages and messages[0].get("role") == "system":
                messages[0]["content"] = f"{messages[0]['content']}\n\n{instruction}"
            else:
                messages.insert(0, {"role": "system", "content": instruction})
        return messages

    def _encode(self, messages: list[Message] | RawPrompt, tools: list[Tool] | None, max_new_tokens: int) -> list[int]:
        tok = self.tokenizer
        if isinstance(messages, RawPrompt):  # its author's control tokens are meant: encoded as written
            ids: list[int] = tok.encode(messages.text, add_special_tokens=True)
        else:  # only the template's own markers are control tokens, never a message's text (prompt_ids.py)
            ids = chat_ids(tok, messages, tools)
        limit = self.runtime.max_length
        if limit and len(ids) + max_new_tokens > limit:
            raise too_long(messages, ids, tok, max_new_tokens, limit)
        self.core.kv_budget.check(len(ids), max_new_tokens)
        return ids

    def _call(self, prompt: Prompt, output_type: object, system: str | None, tools: list[Tool] | None,
              tool_choice: object, config: SpecConfig | dict[str, object] | None, timeout: float | None,
              **keys: Any) -> Call:
        """The one place a call's keywords become a Call: the per-call keys (None: not given) over `config` over
        the engine's config (InvalidParameterError for a bad value or an engine-wide key)."""
        return Call(prompt, output_type, system, tools, tool_choice, self.config.for_call(config, **keys), timeout)

    def cache_info(self) -> dict[str, Any]:
        """The prefix cache: lookups, hits, hit_rate, cached_tokens, bytes in use and budget per tier, spills; and
        under "preemption": rows paused and resumed (restored, or re-prefilled when their KV was lost), requests
        paused now, and the spill store ("store": spills, bytes and budgets per tier)."""
        return self.core.cache_info()

    def clear_cache(self) -> None:
        """Drop every cached prompt prefix (those a running request holds stay until it is done)."""
        self.prefix_cache.clear()

    # -- public calls: every one is a request (or a few: retries) to the scheduler -------------------------------
    @checked_keywords
    def run(self, prompt: Prompt, output_type: object = None, *, system: str | None = None,
            tools: list[Tool] | None = None, tool_choice: object = None, max_new_tokens: int | None = None,
            temperature: float | None = None, top_p: float | None = None, seed: int | None = None,
            stop: str | list[str] | None = None, cache_salt: str | None = None,
            config: SpecConfig | dict[str, object] | None = None, timeout: float | None = None) -> Result[Any]:
        """Generate once (plus validation retries) and return the value with its text, tokens and stats.

        The keywords are those of `stream`, `arun` and `astream` too: `system` (prepended to the schema
        instruction), `tools` (OpenAI tool dicts: without an output type the reply is a ToolReply whose calls the
        grammar checked) and `tool_choice`; the decoding keys `max_new_tokens`, `temperature`, `top_p`, `seed`,
        `stop`, `cache_salt` (keeps this call's cached prompt prefix apart from other salts: per tenant), and
        `config` (a SpecConfig or dict of its per-call keys, under the keys given here); `timeout` (seconds,
        queue and decoding and retries together) cancels the request and raises RequestTimeoutError.
        Safe from any number of threads: concurrent calls share the engine's batches."""
        call = self._call(prompt, output_type, system, tools, tool_choice, config, timeout,
                          max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed, stop=stop,
                          cache_salt=cache_salt)
        plan, until = self._attempts(call), deadline(timeout)
        job = next(plan)
        while True:
            req = self.scheduler.submit(*job)
            try:
                out = req.result(until)
            finally:
                req.cancel()  # a no-op once finished; frees the slot if this thread was interrupted
            try:
                job = plan.send(out)
            except StopIteration as done:
                result: Result[Any] = done.value
                return result

    def _attempts(self, call: Call) -> Generator[tuple[list[int], Constraint, SpecConfig], Output, Result[Any]]:
        """The retry loop without I/O: yields each attempt's (prompt ids, constraint, config), receives the
        finished request's Output, returns the validated Result. `run` drives it from a thread, `arun` from a task."""
        cfg, tools = call.config, call.tools
        spec = reply_spec(self.tokenizer, call.output_type, tools, call.tool_choice)
        constraint = self._compile(spec)
        messages = self._messages(call.prompt, spec, call.system)
        attempts: list[Message] = []
        ending = Ending(self.tokenizer, spec, constraint, cfg)
        for _ in range(cfg.max_retries + 1):
            fork = constraint.fork()
            out = yield self._encode(messages, tools, cfg.max_new_tokens), fork, cfg
            text = final_text(ending, out)
            result = Result(value=text, text=text, token_ids=out.token_ids, stats=out.stats,
                            finish_reason=out.finish_reason)
            try:
                result.value = spec.parse(result.text, out.token_ids)
            except RETRYABLE as err:
                if result.finish_reason == "length" and spec.spec.mode == "code":  # cut: the budget won't help
                    raise IncompleteOutputError(
                        f"max_new_tokens={cfg.max_new_tokens} ran out and the output does not parse ({err}); "
                        "raise max_new_tokens", result.text, result.token_ids, result.stats) from err
                attempts.append({"text": result.text, "error": str(err), "stats": result.stats})
                if isinstance(messages, RawPrompt):
                    break  # no conversation to feed the error back into
                messages = messages + [  # a retry is a new request, queued like any other
                    {"role": "assistant", "content": result.text},
                    {"role": "user", "content": f"That answer failed validation:\n{err}\nAnswer again, fixing it."},
                ]
                continue
            result.attempts = attempts
            return result
        raise ValidationRetryError(
            f"the output failed validation {len(attempts)} times (max_retries={cfg.max_retries}"
            f"{'; a RawPrompt is not retried' if isinstance(messages, RawPrompt) else ''}); "
            f"last error: {attempts[-1]['error']}", attempts)

    @overload
    def generate(self, prompt: Prompt, output_type: None = None, *, tools: Sequence[Tool], **kwargs: Any
                 ) -> ToolReply: ...

    @overload
    def generate(self, prompt: Prompt, output_type: None = None, **kwargs: Any) -> str: ...

    @overload
    def generate(self, prompt: Prompt, output_type: type[T], **kwargs: Any) -> T: ...
    def generate(self, prompt: Prompt, output_type: object = None, **kwargs: Any) -> Any:
        """The validated value: an instance of a Pydantic model, a dict for a JSON schema, a str for free text, a
        ToolReply with `tools=` and no output type."""
        return self.run(prompt, output_type, **kwargs).value

    def generate_many(self, prompts: Sequence[Prompt], output_type: object = None, *, progress: bool = True,
                      return_exceptions: bool = False, **kwargs: Any) -> list[Any]:
        """`generate` over many prompts at once (batched), in input order, with a progress bar for long lists.
        return_exceptions=True puts each failure in its place instead of raising the first one."""
        from specstruct.api.many import generate_many

        return generate_many(self, prompts, output_type, progress=progress, return_exceptions=return_exceptions,
                             **kwargs)

    @checked_keywords
    def stream(self, prompt: Prompt, output_type: object = None, *, system: str | None = None,
               tools: list[Tool] | None = None, tool_choice: object = None, max_new_tokens: int | None = None,
               temperature: float | None = None, top_p: float | None = None, seed: int | None = None,
               stop: str | list[str] | None = None, cache_salt: str | None = None,
               config: SpecConfig | dict[str, object] | None = None, timeout: float | None = None) -> Iterator[Chunk]:
        """Yield text as it is accepted (several tokens at once when drafts are accepted); `run`'s keywords. JSON
        modes also carry the partial object. The last chunk carries the validated Result; a stream is validated
        once, without retries. A stream is a request like any other: reading it slowly never blocks other calls,
        and closing (or dropping) it cancels the request."""
        until = deadline(timeout)  # compiling counts, as in run()
        call = self._call(prompt, output_type, system, tools, tool_choice, config, timeout,
                          max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed, stop=stop,
                          cache_salt=cache_salt)
        chunks, job = self._stream_job(call)
        req = self.scheduler.submit(*job)
        try:
            for new in req.tokens(until):
                if (chunk := chunks.push(new)) is not None:
                    yield chunk
        finally:
            req.cancel()
        assert req.output is not None  # set once its tokens end
        yield chunks.final(req.output)

    def _stream_job(self, call: Call) -> tuple[StreamChunks, tuple[list[int], Constraint, SpecConfig]]:
        cfg = call.config
        spec = reply_spec(self.tokenizer, call.output_type, call.tools, call.tool_choice)
        compiled = self._compile(spec)
        constraint = compiled.fork()
        ids = self._encode(self._messages(call.prompt, spec, call.system), call.tools, cfg.max_new_tokens)
        return StreamChunks(Ending(self.tokenizer, spec, compiled, cfg)), (ids, constraint, cfg)

    # -- asyncio: the same requests, awaited on the loop (no thread per call); a cancelled task, a `timeout=` or
    # an abandoned `astream` cancels its request
    @checked_keywords
    async def arun(self, prompt: Prompt, output_type: object = None, *, system: str | None = None,
                   tools: list[Tool] | None = None, tool_choice: object = None, max_new_tokens: int | None = None,
                   temperature: float | None = None, top_p: float | None = None, seed: int | None = None,
                   stop: str | list[str] | None = None, cache_salt: str | None = None,
                   config: SpecConfig | dict[str, object] | None = None, timeout: float | None = None) -> Result[Any]:
        """`run` for asyncio (same keywords): `result = await engine.arun(prompt, Person)`."""
        call = self._call(prompt, output_type, system, tools, tool_choice, config, timeout,
                          max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed, stop=stop,
                          cache_salt=cache_salt)
        plan = self._attempts(call)
        loop, until = asyncio.get_running_loop(), deadline(timeout)
        job = await loop.run_in_executor(None, next, plan)  # compiling a schema may take a while: not on the loop
        while True:
            req = self.scheduler.submit(*job, loop=loop)
            try:
                out = await req.aresult(until)
            finally:
                req.cancel()  # a no-op once finished; frees the slot when the task was cancelled
            try:
                job = plan.send(out)
            except StopIteration as done:
                result: Result[Any] = done.value
                return result

    async def agenerate(self, prompt: Prompt, output_type: object = None, **kwargs: Any) -> Any:
        """`generate` for asyncio: the validated value."""
        return (await self.arun(prompt, output_type, **kwargs)).value

    @checked_keywords
    async def astream(self, prompt: Prompt, output_type: object = None, *, system: str | None = None,
                      tools: list[Tool] | None = None, tool_choice: object = None, max_new_tokens: int | None = None,
                      temperature: float | None = None, top_p: float | None = None, seed: int | None = None,
                      stop: str | list[str] | None = None, cache_salt: str | None = None,
                      config: SpecConfig | dict[str, object] | None = None, timeout: float | None = None
                      ) -> AsyncIterator[Chunk]:
        """`stream` for asyncio (same keywords): `async for chunk in engine.astream(prompt, Person): ...`."""
        loop, until = asyncio.get_running_loop(), deadline(timeout)
        call = self._call(prompt, output_type, system, tools, tool_choice, config, timeout,
                          max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed, stop=stop,
                          cache_salt=cache_salt)
        chunks, job = await loop.run_in_executor(None, self._stream_job, call)
        req = self.scheduler.submit(*job, loop=loop)
        try:
            async for new in req.atokens(until):
                if (chunk := chunks.push(new)) is not None:
                    yield chunk
        finally:
            req.cancel()
        assert req.output is not None  # set once its tokens end
        yield chunks.final(req.output)

    # -- lifetime ---------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the scheduler thread (also at the end of a `with` block, when the engine is garbage-collected,
        and at interpreter exit). Waiting and running requests fail with EngineClosedError."""
        self._finalizer()

    def __enter__(self) -> "SpecStruct":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
