"""The settings, split by when they are read.

- EngineConfig: what an engine is built with, read once when the models load (weights, device, the draft's
  numerics, KV memory budgets). A call cannot change them.
- SpecConfig: what a call asks for (decoding, speculation, retries, prefix-cache use). An engine keeps one as every
  call's default; a call's `config=` and keywords are merged over it (`for_call`).
- BatchConfig: how an engine's scheduler batches concurrent requests.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from specstruct.errors import InvalidParameterError


GiB = 2**30


class KVMemory(BaseModel):
    """Byte budgets of the KV memory tiers (defaults sized for a 24 GB machine)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # KV of all running requests together (target + draft): past it the scheduler pauses the most recently admitted
    # rows and moves their KV down (docs/kv-memory.md); a request that cannot fit even alone is refused. None: no limit
    active_bytes: int | None = Field(4 * GiB, ge=1)  # None: no limit (0 is refused: it would fit nothing)
    pinned_bytes: int = Field(2 * GiB, ge=0)  # GPU only: pinned host memory below GPU memory
    disk_bytes: int = Field(4 * GiB, ge=0)  # spill files (safetensors); 0: nothing goes to disk
    directory: str | None = None  # where spill files go (default $SPECSTRUCT_CACHE/kv, ~/.cache/specstruct/kv)


DEFAULT_CAPS = {"json": 8, "regex": 8, "choice": 8, "grammar": 8, "code": 8, "text": 2}
MAX_CAP = 64  # a row's pass then stays well inside the measured row-invariance range (300 rows)


SAMPLING_EPS = 1e-5  # temperatures below this decode greedily (vLLM's rule)


class EngineConfig(BaseModel):
    """What an engine is built with: read once, when the models load, never per call.

    >>> SpecStruct.from_pretrained("qwen2.5-coder-1.5b", engine_config=EngineConfig(weights="float32"))
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    draft_model_path: str | None = None  # from_pretrained's draft when none is passed
    # The draft's numerics never change the output (the target verifies every token), only its speed.
    draft_numerics: Literal["int8", "float32"] = "int8"
    # The draft's LM head computes only the token ids below this (0: all): a cheaper draft step, the same output
    # (runtime/draft_head.py). Needs a draft whose head keeps GGUF blocks.
    draft_head_tokens: int = Field(0, ge=0)
    # placement, read by from_pretrained
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?|mps)$")
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    # "auto": GGUF files and pulled registry models keep their quantized blocks (CPU); others load as they ship.
    # "gguf" insists on the blocks, "q8_0" rounds float weights to Q8_0 on load, "float32" widens everything.
    weights: Literal["auto", "gguf", "q8_0", "float32"] = "auto"
    # KV memory: the prefix cache's resident budget (0 disables it) and the tiers below and beside it
    prefix_cache_bytes: int = Field(1 * GiB, ge=0)
    kv_memory: KVMemory = Field(default_factory=KVMemory)

    @model_validator(mode="before")
    @classmethod
    def _no_call_keys(cls, data: Any) -> Any:
        calls = sorted(set(SpecConfig.model_fields) & set(data)) if isinstance(data, dict) else []
        if calls:
            raise ValueError(f"{calls} are what a call asks for, not how the engine is built: pass them as "
                             f"config=SpecConfig({', '.join(f'{k}=...' for k in calls)}) (every call's default) or "
                             "per call")
        return data

    @classmethod
    def of(cls, value: "EngineConfig | dict[str, Any] | None") -> "EngineConfig":
        """An EngineConfig from itself, a dict of its keys (InvalidParameterError naming a bad one) or None."""
        if isinstance(value, EngineConfig):
            return value
        if value is not None and not isinstance(value, dict):
            raise TypeError(f"engine_config= takes an EngineConfig or a dict of its keys, got {type(value).__name__}")
        return _validated(EngineConfig, value or {}, "engine")


ENGINE_KEYS = frozenset(EngineConfig.model_fields)


def engine_key_error(keys: list[str]) -> str:
    return (f"{keys} shape the engine itself (its models, caches and memory), not one call: pass them when building "
            f"it, as engine_config=EngineConfig({', '.join(f'{k}=...' for k in keys)}) to SpecStruct or "
            "from_pretrained")


def split_params(params: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """A flat dict of keys (from_pretrained's decoding_params, a Ray deployment's config): (EngineConfig's,
    SpecConfig's)."""
    params = params or {}
    return ({k: v for k, v in params.items() if k in ENGINE_KEYS},
            {k: v for k, v in params.items() if k not in ENGINE_KEYS})


class SpecConfig(BaseModel):
    """What a call asks for: decoding, speculation, retries, prefix-cache use. An engine keeps one as its calls'
    default. Unknown keys are an error, so a typo never goes unnoticed; EngineConfig's keys are refused with the
    call that sets them.

    >>> SpecConfig(enable_speculative=False, max_new_tokens=64)
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # speculation
    enable_speculative: bool = True
    initial_candidates: int = Field(3, ge=1, le=16)  # 0 never grew; enable_speculative=False turns it off
    adaptive_threshold: float = Field(0.7, gt=0.0, lt=1.0)
    # per output mode; the modes given replace their defaults, the others keep them ({"json": 16} leaves text at 2)
    max_candidates: dict[str, int] = Field(default_factory=lambda: dict(DEFAULT_CAPS))
    use_forced_text: bool = True
    use_prompt_lookup: bool = True
    # In JSON, where the grammar has a choice, propose a string's or number's end, the next key in schema order, a
    # value's opening quote and another item (spec/proposers/guess.py).
    use_structure_guesses: bool = True
    # Copy from this tenant's (this cache_salt's) earlier prompts and outputs where the text written last recurs in
    # them (spec/proposers/suffix.py): agent loops and repeated extractions. Never across tenants.
    use_suffix_index: bool = True
    use_draft_model: bool = True
    # Greedy: the draft model checks forced-text and lookup candidates and replaces them where it disagrees.
    draft_arbitration: bool = True
    # Stop a row's draft after a token the draft model gives less than this probability under the mask (0: never).
    # Lossless either way (it only changes how far the draft runs before the target verifies it). Off by default: it
    # measured neutral on JSON and code, and on prose only paid with a longer text cap in the ablation, not in the
    # bench (`python -m benchmarks.ablation --variants ...,confidence-0.5`).
    draft_confidence: float = Field(0.0, ge=0.0, lt=1.0)

    # typed API
    max_retries: int = Field(2, ge=0)

    # decoding
    max_new_tokens: int = Field(512, ge=1)
    temperature: float = Field(0.0, ge=0.0, allow_inf_nan=False)  # 0 (or under SAMPLING_EPS): greedy
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)  # what torch.Generator.manual_seed takes
    stop: list[str] = Field(default_factory=list)  # one string is taken as a list of one (as OpenAI and HF do)

    # prompt prefixes: False prefills cold and caches nothing; requests share cached prefixes only with the same salt
    use_prefix_cache: bool = True
    cache_salt: str | None = None

    _given_caps: frozenset[str] | None = PrivateAttr(default=None)  # the modes max_candidates was given

    def __getattr__(self, name: str) -> Any:
        if name in ENGINE_KEYS:  # code written when one config held both
            raise AttributeError(f"SpecConfig has no {name!r}: it is how the engine is built, "
                                 f"engine.engine_config.{name} (an EngineConfig)")
        return super().__getattr__(name)  # type: ignore[misc]

    @model_validator(mode="before")
    @classmethod
    def _no_engine_keys(cls, data: Any) -> Any:
        engine = sorted(ENGINE_KEYS & set(data)) if isinstance(data, dict) else []
        if engine:
            raise ValueError(engine_key_error(engine))
        return data

    @model_validator(mode="wrap")
    @classmethod
    def _remember_caps(cls, data: Any, handler: Any) -> Any:
        config = handler(data)  # validated, max_candidates lists every mode: which ones the caller set is kept
        if isinstance(data, dict) and isinstance(data.get("max_candidates"), dict):
            config._given_caps = frozenset(data["max_candidates"])
        return config

    @field_validator("max_candidates", mode="before")
    @classmethod
    def _caps(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value  # pydantic names the type error
        unknown = sorted(set(value) - set(DEFAULT_CAPS))
        if unknown:
            raise ValueError(f"unknown output modes {unknown}; the modes are {sorted(DEFAULT_CAPS)}")
        bad = {k: v for k, v in value.items() if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_CAP}
        if bad:
            raise ValueError(f"candidates per step must be whole numbers from 0 to {MAX_CAP}, got {bad}")
        return {**DEFAULT_CAPS, **value}

    @field_validator("temperature")
    @classmethod
    def _greedy_below_eps(cls, value: float) -> float:
        # logits / 1e-39 overflow to inf and sampling fails on NaN: like vLLM, a temperature under 1e-5 is greedy
        return 0.0 if value < SAMPLING_EPS else value

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    def for_call(self, config: "SpecConfig | dict[str, Any] | None", **overrides: Any) -> "SpecConfig":
        """The config of one call: `config` (a SpecConfig: the keys it was given, an explicit None included, as
        `seed=None` for an unseeded call; or a dict of keys; None: this one) over this one, then `overrides` (None
        values: not given). `max_candidates` merges per mode over this engine's caps, not the defaults."""
        if isinstance(config, SpecConfig):  # its defaults would reset the engine's own values
            given = {k: getattr(config, k) for k in config.model_fields_set}
            if "max_candidates" in given:  # validated, it lists every mode: only the modes the caller gave
                modes = config._given_caps or frozenset(given["max_candidates"])
                given["max_candidates"] = {m: v for m, v in given["max_candidates"].items() if m in modes}
        elif isinstance(config, dict):
            given = {k: v for k, v in config.items() if v is not None}
        elif config is None:
            given = {}
        else:
            raise TypeError(f"config= takes a SpecConfig or a dict of its keys, got {type(config).__name__}")
        keys = {**given, **{k: v for k, v in overrides.items() if v is not None}}
        engine = sorted(ENGINE_KEYS & set(keys))
        if engine:
            raise InvalidParameterError(engine_key_error(engine))
        if isinstance(keys.get("max_candidates"), dict):
            keys["max_candidates"] = {**self.max_candidates, **keys["max_candidates"]}
        return _validated(SpecConfig, {**self.model_dump(), **keys})

    def merged(self, **overrides: Any) -> "SpecConfig":
        """A copy with the given keys replaced (None values are ignored). A bad value raises
        InvalidParameterError naming the key and the allowed range."""
        return _validated(SpecConfig, {**self.model_dump(), **{k: v for k, v in overrides.items() if v is not None}})

    def cap(self, mode: str) -> int:
        """Largest number of draft candidates per step for an output mode."""
        return self.max_candidates.get(mode, DEFAULT_CAPS["json"])


def config_hint(unknown: list[str]) -> str:
    """For a call given keywords it does not name: which of them are SpecConfig keys, and how to pass them."""
    keys = [k for k in unknown if k in SpecConfig.model_fields]
    engine = [k for k in unknown if k in ENGINE_KEYS]
    hint = f"; {keys} are SpecConfig keys: pass config={{{', '.join(f'{k!r}: ...' for k in keys)}}}" if keys else ""
    return hint + (f"; {engine_key_error(engine)}" if engine else "")


M = TypeVar("M", bound=BaseModel)


def _validated(model: type[M], data: dict[str, Any], what: str = "decoding") -> M:
    try:
        return model(**data)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}={e.get('input')!r}: {e['msg']}"
                             for e in err.errors())
        raise InvalidParameterError(f"invalid {what} parameter: {problems}") from None


class BatchConfig(BaseModel):
    """How an engine batches concurrent requests (the key names serving deployments use).

    >>> BatchConfig(max_batch_size=8, timeout_ms=50, fill_strategy="sequential", max_queue=256)

    - max_batch_size: most rows decoded together in one target pass;
    - timeout_ms: how long an idle engine may collect a burst of arrivals before its first pass; it starts as
      soon as 5 ms pass without a new arrival, so a lone request is not delayed (0: start at once);
    - fill_strategy: "sequential" refills free slots in arrival order, at the next step (continuous batching);
    - max_queue: most requests waiting for a slot; past it a new request gets `OverloadedError` at once.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    max_batch_size: int = Field(8, ge=1, le=256)
    timeout_ms: float = Field(50.0, ge=0.0, le=60_000.0)
    fill_strategy: Literal["sequential"] = "sequential"
    max_queue: int = Field(256, ge=0)
