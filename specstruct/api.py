"""SpecStruct: the public entry point.

    engine = SpecStruct.from_pretrained("qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b")
    person = engine.generate("Extract: Ada Lovelace, 36.", Person)      # -> Person
"""

from __future__ import annotations

import threading
from typing import Any, Iterator, Sequence, TypeVar, overload

import torch

from .config import SpecConfig
from .constraints import Constraint, compile_constraint
from .decoding.engine import Engine
from .errors import IncompleteOutputError, PromptTooLongError, ValidationRetryError
from .output_types import OutputSpec, resolve
from .results import Chunk, Result
from .decoding.kv.memory import KVBudget, build as build_kv_tiers
from .decoding.runtime import ModelRuntime, quantize_draft
from .streaming import IncrementalDetokenizer, partial_json

T = TypeVar("T")
Prompt = str | Sequence[dict[str, Any]]
RETRYABLE = (ValueError, SyntaxError, TypeError)  # pydantic.ValidationError is a ValueError
EOS_NAMES = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>")


def eos_token_ids(tokenizer, model) -> list[int]:
    """Every id that ends a turn: the tokenizer's EOS, the generation config's, and the usual chat end tokens."""
    ids = {tokenizer.eos_token_id}
    gen = getattr(model, "generation_config", None)
    extra = getattr(gen, "eos_token_id", None)
    ids.update(extra if isinstance(extra, (list, tuple)) else [extra])
    vocab = tokenizer.get_vocab()
    ids.update(vocab[name] for name in EOS_NAMES if name in vocab)
    return sorted(i for i in ids if i is not None)


class SpecStruct:
    """A target model (and optionally a draft model) that generates constrained output, speculatively."""

    def __init__(self, model, tokenizer, draft_model=None, config: SpecConfig | None = None, *,
                 draft_tokenizer=None, model_name: str | None = None):
        self.config = config or SpecConfig()
        self.model, self.tokenizer, self.draft_model = model, tokenizer, draft_model
        self.model_name = model_name or getattr(model.config, "_name_or_path", None) or type(model).__name__
        if draft_model is not None:
            from .models.loading import check_same_vocab

            check_same_vocab(tokenizer, draft_tokenizer or tokenizer, model, draft_model)
        self.eos_token_ids = eos_token_ids(tokenizer, model)
        self.runtime = ModelRuntime(model)
        draft_rt = None
        if draft_model is not None:
            if self.config.draft_numerics == "int8" and next(draft_model.parameters()).device.type == "cpu":
                draft_model = quantize_draft(draft_model)
            draft_rt = ModelRuntime(draft_model)
        self.draft_model = draft_model
        # prefix cache shared by target and draft (namespaced by model and numerics), spill store, budget check
        self.prefix_cache, self.kv_store = build_kv_tiers(self.config.prefix_cache_bytes, self.config.kv_memory,
                                                          self.runtime.device)
        for rt in (self.runtime, draft_rt):
            if rt is not None:
                rt.prefix_cache = self.prefix_cache
        self._kv_budget = KVBudget(self.config.kv_memory.active_bytes, model, draft_model)
        self.engine = Engine(self.runtime, tokenizer, self.eos_token_ids, draft=draft_rt, config=self.config)
        self.numerics = self.engine.numerics
        self._lock = threading.Lock()  # one sequence at a time: the KV caches are per engine

    @classmethod
    def from_pretrained(cls, model: str, draft: str | None = None, *, config: SpecConfig | None = None,
                        decoding_params: dict[str, Any] | None = None) -> "SpecStruct":
        """Load a registry name (`qwen2.5-coder-1.5b`), hub id, local folder or .gguf file, plus an optional draft
        model with the same vocabulary. `decoding_params` takes the same keys as SpecConfig."""
        from .models.loading import load

        config = config or SpecConfig(**(decoding_params or {}))
        device = config.device if config.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = getattr(torch, config.dtype) if config.dtype != "auto" else torch.float32
        target, tokenizer = load(model, device=device, dtype=dtype)
        draft = draft or config.draft_model_path
        draft_model = draft_tok = None
        if draft:
            draft_model, draft_tok = load(draft, device=device, dtype=dtype)
        return cls(target, tokenizer, draft_model, config, draft_tokenizer=draft_tok, model_name=str(model))

    # -- building blocks ----------------------------------------------------------------------------------------
    def constraint(self, output_type: Any = None) -> Constraint:
        """The compiled constraint for an output type, over this engine's tokenizer (cached)."""
        return self._compile(resolve(output_type))

    def _compile(self, spec: OutputSpec) -> Constraint:
        return compile_constraint(spec.spec, self.tokenizer, vocab_size=self.runtime.vocab_size,
                                  eos_token_ids=self.eos_token_ids)

    def messages(self, prompt: Prompt, output_type: Any = None, *, system: str | None = None) -> list[dict[str, Any]]:
        """The chat messages a call sends: the prompt plus a system instruction naming the output's schema."""
        return self._messages(prompt, resolve(output_type), system)

    def prompt_ids(self, prompt: Prompt, output_type: Any = None, *, system: str | None = None,
                   tools: list[dict] | None = None, max_new_tokens: int | None = None) -> list[int]:
        """The exact prompt token ids a call sends to the model (chat template applied)."""
        return self._encode(self.messages(prompt, output_type, system=system), tools,
                            max_new_tokens or self.config.max_new_tokens)

    def _messages(self, prompt: Prompt, spec: OutputSpec, system: str | None) -> list[dict[str, Any]]:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
        instruction = "\n\n".join(s for s in (system, spec.instruction) if s)
        if instruction:
            if messages and messages[0].get("role") == "system":
                messages[0]["content"] = f"{messages[0]['content']}\n\n{instruction}"
            else:
                messages.insert(0, {"role": "system", "content": instruction})
        return messages

    def _encode(self, messages: list[dict[str, Any]], tools: list[dict] | None, max_new_tokens: int) -> list[int]:
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        else:
            text = "\n\n".join(str(m["content"]) for m in messages) + "\n\n"
        ids = tok.encode(text, add_special_tokens=False)
        limit = self.runtime.max_length
        if limit and len(ids) + max_new_tokens > limit:
            raise PromptTooLongError(
                f"the prompt has {len(ids)} tokens and max_new_tokens is {max_new_tokens}, but the model's context "
                f"window is {limit} tokens: shorten the prompt or lower max_new_tokens"
            )
        self._kv_budget.check(len(ids), max_new_tokens)
        return ids

    @staticmethod
    def _code_stop(cfg: SpecConfig, spec: OutputSpec) -> SpecConfig:
        """Code mode stops at the fence that closes a ```python block: what chat models write after it is prose."""
        if spec.spec.mode == "code" and "\n```" not in cfg.stop:
            return cfg.merged(stop=[*cfg.stop, "\n```"])
        return cfg

    def _config(self, config: SpecConfig | None, **overrides: Any) -> SpecConfig:
        base = self.config if config is None else config
        return base.merged(**overrides)

    def cache_info(self) -> dict[str, Any]:
        """The prefix cache: lookups, hits, hit_rate, cached_tokens, bytes in use and budget per tier, spills."""
        return self.prefix_cache.info()

    def clear_cache(self) -> None:
        """Drop every cached prompt prefix (those a running request holds stay until it is done)."""
        self.prefix_cache.clear()

    # -- public calls -------------------------------------------------------------------------------------------
    def run(self, prompt: Prompt, output_type: Any = None, *, system: str | None = None,
            tools: list[dict] | None = None, max_new_tokens: int | None = None, temperature: float | None = None,
            top_p: float | None = None, seed: int | None = None, stop: list[str] | None = None,
            config: SpecConfig | None = None, cache_salt: str | None = None) -> Result:
        """Generate once (plus validation retries) and return the value with its text, tokens and stats.
        `cache_salt` keeps this call's cached prompt prefix apart from calls with another salt (per tenant)."""
        cfg = self._config(config, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                           seed=seed, stop=stop, cache_salt=cache_salt)
        spec = resolve(output_type)
        cfg = self._code_stop(cfg, spec)
        constraint = self._compile(spec)
        messages = self._messages(prompt, spec, system)
        attempts: list[dict[str, Any]] = []
        for attempt in range(cfg.max_retries + 1):
            result = self._run_once(messages, tools, spec, constraint.fork(), cfg)
            try:
                result.value = spec.parse(result.text)
            except RETRYABLE as err:
                if result.finish_reason == "length":  # cut short (code mode): retrying with the same budget won't help
                    raise IncompleteOutputError(
                        f"max_new_tokens={cfg.max_new_tokens} ran out and the output does not parse ({err}); "
                        "raise max_new_tokens", result.text, result.token_ids, result.stats) from err
                attempts.append({"text": result.text, "error": str(err), "stats": result.stats})
                messages = messages + [
                    {"role": "assistant", "content": result.text},
                    {"role": "user", "content": f"That answer failed validation:\n{err}\nAnswer again, fixing it."},
                ]
                continue
            result.attempts = attempts
            return result
        raise ValidationRetryError(
            f"the output failed validation {len(attempts)} times (max_retries={cfg.max_retries}); "
            f"last error: {attempts[-1]['error']}", attempts)

    def _run_once(self, messages, tools, spec: OutputSpec, constraint: Constraint, cfg: SpecConfig,
                  on_tokens=None) -> Result:
        ids = self._encode(messages, tools, cfg.max_new_tokens)
        with self._lock:
            decode = self.engine.decode(ids, constraint, cfg)
            for new in decode:
                if on_tokens is not None:
                    on_tokens(new)
        text = self._finish(decode, spec, constraint, cfg)
        return Result(value=text, text=text, token_ids=decode.token_ids, stats=decode.stats,
                      finish_reason=decode.finish_reason)

    def _finish(self, decode, spec: OutputSpec, constraint: Constraint, cfg: SpecConfig) -> str:
        """The final text (cut at a stop string); raises when max_new_tokens cut a structured output short."""
        text = self.tokenizer.decode(decode.token_ids, skip_special_tokens=True)
        for s in cfg.stop:
            if s in text:
                text = text[: text.index(s)]
        if decode.finish_reason == "length" and spec.spec.mode not in ("text", "code") and not constraint.is_final():
            raise IncompleteOutputError(
                f"max_new_tokens={cfg.max_new_tokens} ran out before the {spec.spec.mode} output was complete; "
                f"raise max_new_tokens. Partial output: {text[:200]!r}", text, decode.token_ids, decode.stats)
        return text

    @overload
    def generate(self, prompt: Prompt, output_type: None = None, **kwargs: Any) -> str: ...

    @overload
    def generate(self, prompt: Prompt, output_type: type[T], **kwargs: Any) -> T: ...
    def generate(self, prompt: Prompt, output_type: Any = None, **kwargs: Any) -> Any:
        """The validated value: an instance of a Pydantic model, a dict for a JSON schema, a str for free text."""
        return self.run(prompt, output_type, **kwargs).value

    def stream(self, prompt: Prompt, output_type: Any = None, *, system: str | None = None,
               tools: list[dict] | None = None, config: SpecConfig | None = None, **overrides: Any) -> Iterator[Chunk]:
        """Yield text as it is accepted (several tokens at once when drafts are accepted). JSON modes also carry the
        partial object. The last chunk carries the validated Result; a stream is validated once, without retries."""
        cfg = self._config(config, **overrides)
        spec = resolve(output_type)
        cfg = self._code_stop(cfg, spec)
        constraint = self._compile(spec).fork()
        ids = self._encode(self._messages(prompt, spec, system), tools, cfg.max_new_tokens)
        detok = IncrementalDetokenizer(self.tokenizer)
        json_mode = spec.spec.mode == "json"
        with self._lock:
            decode = self.engine.decode(ids, constraint, cfg)
            for new in decode:
                delta = detok.push(new)
                if delta:
                    yield Chunk(text=delta, partial=partial_json(detok.text) if json_mode else None)
        text = self._finish(decode, spec, constraint, cfg)
        try:
            value = spec.parse(text)
        except RETRYABLE as err:
            raise ValidationRetryError(f"the streamed output failed validation: {err}",
                                       [{"text": text, "error": str(err), "stats": decode.stats}]) from err
        tail = text[detok.emitted:]
        result = Result(value=value, text=text, token_ids=decode.token_ids, stats=decode.stats,
                        finish_reason=decode.finish_reason)
        yield Chunk(text=tail, partial=value if json_mode else None, result=result)
