"""SpecConfig: the decoding and speculation settings, with the key names speculative deployments use."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


GiB = 2**30


class KVMemory(BaseModel):
    """Byte budgets of the KV memory tiers (defaults sized for a 24 GB machine)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    active_bytes: int | None = Field(4 * GiB, ge=0)  # KV of one running request (target + draft); None: no check
    pinned_bytes: int = Field(2 * GiB, ge=0)  # GPU only: pinned host memory below GPU memory
    disk_bytes: int = Field(4 * GiB, ge=0)  # spill files (safetensors); 0: nothing goes to disk
    directory: str | None = None  # where spill files go (default $SPECSTRUCT_CACHE/kv, ~/.cache/specstruct/kv)


class SpecConfig(BaseModel):
    """Settings for one engine or one call. Unknown keys are an error, so a typo never goes unnoticed.

    >>> SpecConfig(enable_speculative=False, max_new_tokens=64)
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # speculation
    enable_speculative: bool = True
    draft_model_path: str | None = None
    initial_candidates: int = Field(3, ge=0, le=16)
    adaptive_threshold: float = Field(0.7, gt=0.0, lt=1.0)
    max_candidates: dict[str, int] = Field(
        default_factory=lambda: {"json": 8, "regex": 8, "choice": 8, "grammar": 8, "code": 8, "text": 2}
    )
    use_forced_text: bool = True
    use_prompt_lookup: bool = True
    use_draft_model: bool = True
    # The draft's numerics never change the output (the target verifies every token), only its speed.
    draft_numerics: Literal["int8", "float32"] = "int8"

    # typed API
    max_retries: int = Field(2, ge=0)

    # decoding
    max_new_tokens: int = Field(512, ge=1)
    temperature: float = Field(0.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: list[str] = Field(default_factory=list)

    # KV memory: reuse of cached prompt prefixes (engine-wide budget; 0 disables) and per-tier budgets
    prefix_cache_bytes: int = Field(1 * GiB, ge=0)
    kv_memory: KVMemory = Field(default_factory=KVMemory)
    use_prefix_cache: bool = True  # per call: False prefills cold and caches nothing
    cache_salt: str | None = None  # per call: requests share cached prefixes only with the same salt (tenant)

    # placement
    device: str = "auto"
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"

    def merged(self, **overrides: Any) -> "SpecConfig":
        """A copy with the given keys replaced (None values are ignored)."""
        data = self.model_dump()
        data.update({k: v for k, v in overrides.items() if v is not None})
        return SpecConfig(**data)

    def cap(self, mode: str) -> int:
        """Largest number of draft candidates per step for an output mode."""
        return self.max_candidates.get(mode, self.max_candidates.get("json", 8))
