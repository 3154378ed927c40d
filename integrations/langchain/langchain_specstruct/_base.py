"""What `ChatSpecStruct` and `SpecStructLLM` share: their parameters, how a call reaches the engine, and how
the engine's statistics become LangChain metadata."""

from __future__ import annotations

import warnings
from typing import Any

from langchain_core.messages.ai import UsageMetadata
from pydantic import BaseModel, ConfigDict, Field, model_validator

from langchain_specstruct._engines import EngineKey, engine_name, get_engine

DEFAULT_MODEL = "qwen2.5-coder-1.5b"

# Keys of specstruct.SpecConfig that a model object (or a call, through `bind`/`invoke` kwargs) may set.
SPEC_KEYS = ("enable_speculative", "initial_candidates", "adaptive_threshold", "max_retries", "max_candidates",
             "use_forced_text", "use_prompt_lookup", "use_draft_model")


def _max_tokens_aliases(values: dict[str, Any]) -> dict[str, Any]:
    """`max_completion_tokens` (OpenAI's newer name) and `max_new_tokens` (specstruct's and transformers') mean
    `max_tokens` here, as ChatOpenAI takes `max_completion_tokens`."""
    alias = next((values[k] for k in ("max_completion_tokens", "max_new_tokens") if values.get(k) is not None), None)
    if alias is None:
        return values
    out = {k: v for k, v in values.items() if k not in ("max_completion_tokens", "max_new_tokens")}
    if out.get("max_tokens") is None:
        out["max_tokens"] = alias
    return out


class SpecStructParams(BaseModel):
    """Parameters common to the chat and completion models. None means "the engine's default"."""

    model_config = ConfigDict(arbitrary_types_allowed=True, protected_namespaces=())

    model: str = DEFAULT_MODEL
    """Registry name ("qwen2.5-coder-1.5b"), hub id, local folder or .gguf file. May also be an already
    built `specstruct.SpecStruct` engine (it is then moved to `engine`)."""
    draft_model: str | None = None
    """Draft model for speculative decoding, e.g. "qwen2.5-coder-0.5b" (same vocabulary as `model`).
    Without one, speculation still uses the free drafters (grammar-forced text, prompt lookup)."""
    engine: Any = Field(default=None, exclude=True)
    """An already loaded `specstruct.SpecStruct` (tests inject tiny models this way); overrides `model`."""
    device: str = "auto"
    dtype: str = "float32"
    temperature: float | None = None
    max_tokens: int | None = None
    """Most new tokens per call (specstruct's `max_new_tokens`)."""
    top_p: float | None = None
    seed: int | None = None
    stop: list[str] | None = None
    timeout: float | None = None
    """Seconds a call may take, queue and decoding together (specstruct's `timeout=`); then RequestTimeoutError."""
    streaming: bool = False
    """If True, `invoke` streams internally (callbacks see every token)."""
    enable_speculative: bool | None = None
    initial_candidates: int | None = None
    adaptive_threshold: float | None = None
    max_retries: int | None = None
    """Validation retries of the typed API (specstruct's `max_retries`), not network retries."""
    max_candidates: dict[str, int] | None = None
    use_forced_text: bool | None = None
    use_prompt_lookup: bool | None = None
    use_draft_model: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _engine_as_model(cls, values: Any) -> Any:
        if isinstance(values, dict) and values.get("model") is not None and not isinstance(values["model"], str):
            values = dict(values)
            values["engine"] = values.pop("model")
        if isinstance(values, dict) and values.get("engine") is not None and "model" not in values:
            values = {**values, "model": engine_name(values["engine"], "specstruct-engine")}
        if isinstance(values, dict):
            values = _max_tokens_aliases(values)
            known = set(cls.model_fields) | {f.alias for f in cls.model_fields.values() if f.alias} | {"api_key"}
            unknown = sorted(k for k in values if k not in known)
            if unknown:  # ChatOpenAI warns too; silently dropping e.g. model_kwargs={"max_tokens": 2} misleads
                warnings.warn(f"{cls.__name__} ignores {unknown}: not parameters of this model (see its fields: "
                              "max_tokens, temperature, top_p, seed, stop, ...)", UserWarning, stacklevel=4)
        return values

    # -- engine and per-call settings -------------------------------------------------------------
    def _engine(self, model: str | None = None) -> Any:
        """The engine for this call: the injected one, else the shared cached one (loaded on first use)."""
        if self.engine is not None and (model is None or model == self.model):
            return self.engine
        name = model or self.model
        speculate = self.enable_speculative is not False and self.use_draft_model is not False
        draft = self.draft_model if (speculate and name == self.model) else None
        return get_engine(EngineKey(name, draft, self.device, self.dtype))

    def _spec_config(self, engine: Any, overrides: dict[str, Any]) -> Any:
        """The engine's SpecConfig with this object's (then this call's) speculative keys laid over it."""
        import specstruct as ss

        base = getattr(engine, "config", None) or ss.SpecConfig()
        values = {k: getattr(self, k) for k in SPEC_KEYS}
        values.update({k: overrides[k] for k in SPEC_KEYS if overrides.get(k) is not None})
        return base.merged(**values)

    def _run_kwargs(self, engine: Any, stop: list[str] | None, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Keyword arguments for `engine.run`/`engine.stream` from fields, per-call kwargs and `stop`."""
        kwargs = _max_tokens_aliases(kwargs)
        pick = lambda k: kwargs[k] if kwargs.get(k) is not None else getattr(self, k)  # noqa: E731
        return {
            "max_new_tokens": pick("max_tokens"),
            "temperature": pick("temperature"),
            "top_p": pick("top_p"),
            "seed": pick("seed"),
            "stop": (stop if stop is not None else self.stop) or None,
            "timeout": pick("timeout"),
            "config": self._spec_config(engine, kwargs),
        }

    def _model_name(self, engine: Any) -> str:
        return self.model if self.engine is None else engine_name(engine, self.model)


# -- metadata ---------------------------------------------------------------------------------------
def usage_metadata(stats: Any) -> UsageMetadata:
    inp, out = int(getattr(stats, "prompt_tokens", 0)), int(getattr(stats, "new_tokens", 0))
    return UsageMetadata(input_tokens=inp, output_tokens=out, total_tokens=inp + out)


def speculative_metadata(stats: Any) -> dict[str, Any]:
    """The decoding statistics worth showing next to a response (all plain numbers, JSON-serialisable)."""
    keys = ("mode", "target_forwards", "drafted", "accepted", "acceptance_rate", "tokens_per_forward",
            "tokens_per_s", "elapsed_s", "prefill_s", "mask_time_s", "draft_time_s", "verify_time_s", "queue_s",
            "batch_rows")
    out = {k: getattr(stats, k) for k in keys if hasattr(stats, k)}
    per = getattr(stats, "per_drafter", None) or {}
    out["per_drafter"] = {
        name: {"proposed": d.proposed, "accepted": d.accepted, "acceptance_rate": d.acceptance_rate}
        for name, d in per.items()
    }
    return out
