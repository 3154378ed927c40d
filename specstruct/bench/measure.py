"""What every side of the benchmark shares: run settings, one measurement, and the exact prompt ids."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any

from specstruct.bench.workloads import Workload


@dataclass
class Settings:
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    repeats: int = 1  # runs of each prompt per side, alternating which side goes first; the median run is kept


@dataclass
class Measurement:
    """One side's run of one prompt. Speculation fields are None for sides that do not report them."""

    side: str
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    new_tokens: int = 0
    elapsed_s: float = 0.0
    tokens_per_s: float = 0.0
    finish_reason: str | None = None
    target_forwards: int | None = None
    drafted: int | None = None
    accepted: int | None = None
    acceptance_rate: float | None = None
    tokens_per_forward: float | None = None
    per_drafter: dict[str, dict[str, Any]] = field(default_factory=dict)
    k_histogram: dict[str, int] = field(default_factory=dict)
    times: dict[str, float] = field(default_factory=dict)
    error: str | None = None


def _plain(obj: Any) -> Any:
    """Stats objects (dataclass, pydantic, plain) -> JSON-ready dicts."""
    if is_dataclass(obj):
        return asdict(obj)
    if hasattr(obj, "model_dump"):
        return obj.model_dump()
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    return obj


def chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Prompt token ids as specstruct encodes them: the chat template rendered to text, then encoded
    without extra special tokens."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]


def prompt_messages(engine: Any, workload: Workload) -> list[dict[str, str]]:
    """The messages specstruct actually sends for this workload (it adds a system instruction naming the
    schema for JSON output types), so every side sees the same prompt tokens."""
    render = getattr(engine, "_messages", None)
    if render is None:
        return workload.messages
    from specstruct.types.output import resolve

    return render(workload.messages, resolve(workload.output_type), None)


def generated_ids(engine: Any, messages: Any, output_type: Any, **kwargs: Any) -> list[int]:
    """The token ids `engine.run` generates, also when max_new_tokens cuts the output short (still decoding work,
    still compared between sides)."""
    from specstruct.errors import IncompleteOutputError

    try:
        return list(engine.run(messages, output_type, **kwargs).token_ids)
    except IncompleteOutputError as exc:
        return list(exc.token_ids)
