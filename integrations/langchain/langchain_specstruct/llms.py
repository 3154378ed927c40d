"""SpecStructLLM: LangChain's text-completion interface (string in, string out) over specstruct."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Iterator

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models.llms import BaseLLM
from langchain_core.outputs import Generation, GenerationChunk, LLMResult

from langchain_specstruct._base import SpecStructParams, speculative_metadata, usage_metadata


class SpecStructLLM(SpecStructParams, BaseLLM):
    """Text completion on a local model through specstruct; the prompt string is passed to `engine.run`
    as is. Per-call keyword `output_type` (anything specstruct accepts: a JSON-schema dict, `ss.Regex`,
    `ss.Choice`, ...) constrains the completion.

    ```python
    llm = SpecStructLLM(model="qwen2.5-coder-1.5b", max_tokens=64)
    llm.invoke("Write a haiku about the sea.")
    llm.invoke("Is the sea wet? Answer yes or no.", output_type=ss.Choice(["yes", "no"]))
    ```
    Each generation's `generation_info` holds finish_reason, token usage and the speculative statistics.
    """

    @property
    def _llm_type(self) -> str:
        return "specstruct"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model": self.model, "draft_model": self.draft_model, "temperature": self.temperature,
                "max_tokens": self.max_tokens}

    def _info(self, result: Any) -> dict[str, Any]:
        return {"finish_reason": result.finish_reason, "usage": dict(usage_metadata(result.stats)),
                "speculative": speculative_metadata(result.stats)}

    def _call_args(self, stop: list[str] | None, kwargs: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
        engine = self._engine()
        output_type = kwargs.get("output_type")
        run_kwargs = self._run_kwargs(engine, stop if output_type is None else None, kwargs)
        return engine, output_type, run_kwargs

    def _generate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        generations: list[list[Generation]] = []
        if self.streaming:
            for prompt in prompts:
                text, info = "", {}
                for chunk in self._stream(prompt, stop, run_manager, **kwargs):
                    text += chunk.text
                    info = chunk.generation_info or info
                generations.append([Generation(text=text, generation_info=info)])
        else:
            engine, output_type, run_kwargs = self._call_args(stop, kwargs)

            def one(prompt: str) -> Generation:
                result = engine.run(prompt, output_type, **run_kwargs)
                return Generation(text=result.text, generation_info=self._info(result))

            if len(prompts) > 1:  # `batch`: the engine's scheduler batches them together
                with ThreadPoolExecutor(min(len(prompts), 64), thread_name_prefix="specstruct-llm") as pool:
                    generations = [[g] for g in pool.map(one, prompts)]
            else:
                generations = [[one(p)] for p in prompts]
        model_name = self._model_name(self._engine())
        return LLMResult(generations=generations, llm_output={"model_name": model_name})

    def _stream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[GenerationChunk]:
        engine, output_type, run_kwargs = self._call_args(stop, kwargs)
        for chunk in engine.stream(prompt, output_type, **run_kwargs):
            if (gen := self._chunk(chunk)) is not None:
                if run_manager:
                    run_manager.on_llm_new_token(gen.text, chunk=gen)
                yield gen

    def _chunk(self, chunk: Any) -> GenerationChunk | None:
        info = self._info(chunk.result) if chunk.result is not None else None
        return None if not chunk.text and info is None else GenerationChunk(text=chunk.text, generation_info=info)

    async def _agenerate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        # resolving the engine may load the model (a first call): not on the event loop
        engine, output_type, run_kwargs = await asyncio.to_thread(self._call_args, stop, kwargs)
        if self.streaming:
            generations: list[list[Generation]] = []
            for prompt in prompts:
                text, info = "", {}
                async for chunk in self._astream(prompt, stop, run_manager, **kwargs):
                    text += chunk.text
                    info = chunk.generation_info or info
                generations.append([Generation(text=text, generation_info=info)])
            return LLMResult(generations=generations, llm_output={"model_name": self._model_name(engine)})
        results = await asyncio.gather(*(engine.arun(p, output_type, **run_kwargs) for p in prompts))
        generations = [[Generation(text=r.text, generation_info=self._info(r))] for r in results]
        return LLMResult(generations=generations, llm_output={"model_name": self._model_name(engine)})

    async def _astream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[GenerationChunk]:
        engine, output_type, run_kwargs = await asyncio.to_thread(self._call_args, stop, kwargs)
        async for chunk in engine.astream(prompt, output_type, **run_kwargs):  # awaited: no thread per call
            if (gen := self._chunk(chunk)) is not None:
                if run_manager:
                    await run_manager.on_llm_new_token(gen.text, chunk=gen)
                yield gen
