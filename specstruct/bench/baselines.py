"""The sides of the comparison, each timed the same way on the same prompt tokens.

    specstruct   speculative constrained decoding (the engine as configured)
    target-only  the same engine and weights, speculation off (`SpecConfig(enable_speculative=False)`)
    outlines     outlines 1.x `from_transformers` on the same model object, same output type
    hf           plain `model.generate` (unconstrained)
    hf-assisted  `model.generate(assistant_model=draft)` (assisted generation, unconstrained)

Each side has `prepare(workload)` (untimed: constraint compilation, generator construction) and
`measure(workload) -> Measurement` (timed with one wall clock around the whole call, prefill included).
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, Iterator

from .fairness import engine_numerics, linear_numerics
from .workloads import Workload


@dataclass
class Settings:
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0


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
    from ..output_types import resolve

    return render(workload.messages, resolve(workload.output_type), None)


@contextmanager
def stock_numerics(*models: Any) -> Iterator[None]:
    """Run a block with transformers' stock numerics on models that specstruct's runtime switched to
    row-invariant numerics (a user of outlines or plain transformers gets the stock ones)."""
    patched = [m for m in models if m is not None and getattr(m, "_specstruct_numerics", None)]
    if not patched:
        yield
        return
    from ..runtime import make_row_invariant, restore_stock

    for m in patched:
        restore_stock(m)
    try:
        yield
    finally:
        for m in patched:
            make_row_invariant(m)


class SpecStructSide:
    """specstruct's own loop; `speculative=False` is the target-only baseline."""

    def __init__(self, name: str, engine: Any, speculative: bool, settings: Settings):
        self.name, self.engine, self.settings = name, engine, settings
        overrides = {"enable_speculative": speculative, "max_retries": 0}  # retries would time 2+ generations
        base = getattr(engine, "config", None)
        if base is None:
            from ..config import SpecConfig

            base = SpecConfig()
        self.config = base.merged(**overrides)
        self.model = engine.model

    def numerics(self) -> str:
        return engine_numerics(self.engine)

    def prepare(self, workload: Workload) -> None:
        """Compile the constraint before the clock starts (the engine caches compiled constraints).
        A ConstraintError propagates: the runner records the workload as unsupported."""
        if workload.output_type is not None and hasattr(self.engine, "constraint"):
            self.engine.constraint(workload.output_type)

    def measure(self, workload: Workload) -> Measurement:
        from ..errors import IncompleteOutputError, ValidationRetryError

        s = self.settings
        start = time.perf_counter()
        try:
            res = self.engine.run(workload.messages, workload.output_type, max_new_tokens=s.max_new_tokens,
                                  temperature=s.temperature, top_p=s.top_p, seed=s.seed, config=self.config)
        except IncompleteOutputError as exc:  # max_new_tokens cut a structured output short: still a timing
            elapsed = time.perf_counter() - start
            n = len(exc.token_ids)
            return Measurement(self.name, exc.text, list(exc.token_ids), new_tokens=n, elapsed_s=elapsed,
                               tokens_per_s=n / elapsed if elapsed > 0 else 0.0, finish_reason="length",
                               error=f"IncompleteOutputError: {str(exc).splitlines()[0][:200]}")
        except ValidationRetryError as exc:  # the text parsed badly; its stats are in the attempt
            elapsed = time.perf_counter() - start
            last = exc.attempts[-1]
            m = self._from_stats(last["stats"], last["text"], [], None, elapsed)
            m.error = f"ValidationRetryError: {last['error'][:200]}"
            return m
        return self._from_stats(res.stats, res.text, list(res.token_ids), res.finish_reason,
                                time.perf_counter() - start)

    def _from_stats(self, st: Any, text: str, ids: list[int], finish: str | None, elapsed: float) -> Measurement:
        n = int(getattr(st, "new_tokens", len(ids)))
        plain = st.to_dict() if hasattr(st, "to_dict") else {}
        return Measurement(
            side=self.name, text=text, token_ids=ids, prompt_tokens=int(st.prompt_tokens),
            new_tokens=n, elapsed_s=elapsed, tokens_per_s=n / elapsed if elapsed > 0 else 0.0,
            finish_reason=finish, target_forwards=st.target_forwards, drafted=st.drafted,
            accepted=st.accepted, acceptance_rate=st.acceptance_rate, tokens_per_forward=st.tokens_per_forward,
            per_drafter=_plain(plain.get("per_drafter", getattr(st, "per_drafter", {})) or {}),
            k_histogram={str(k): v for k, v in (getattr(st, "k_histogram", {}) or {}).items()},
            times={"engine_elapsed_s": st.elapsed_s, "prefill_s": getattr(st, "prefill_s", None),
                   "mask_s": st.mask_time_s, "draft_s": st.draft_time_s, "verify_s": st.verify_time_s},
        )


def eos_ids(engine: Any) -> list[int]:
    """The ids that end a turn, exactly as the engine stops on them (so every side stops alike)."""
    ids = getattr(engine, "eos_token_ids", None)
    if ids:
        return list(ids)
    found = {engine.tokenizer.eos_token_id}
    configured = getattr(getattr(engine.model, "generation_config", None), "eos_token_id", None)
    found |= set(configured if isinstance(configured, list) else [configured])
    return sorted(i for i in found if i is not None)


def _generate_kwargs(tokenizer: Any, eos: list[int], s: Settings) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"max_new_tokens": s.max_new_tokens, "eos_token_id": eos,
                              "pad_token_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]}
    if s.temperature > 0:
        kwargs.update(do_sample=True, temperature=s.temperature, top_p=s.top_p)
    else:
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    return kwargs


def _measure_ids(name: str, tokenizer: Any, eos: list[int], prompt_len: int, out_ids: list[int], elapsed: float,
                 one_forward_per_token: bool) -> Measurement:
    """Batch size 1, so no padding: every returned id was generated (the final EOS included)."""
    new = [int(i) for i in out_ids]
    text = tokenizer.decode(new, skip_special_tokens=True)
    finish = "stop" if new and new[-1] in eos else "length"
    return Measurement(side=name, text=text, token_ids=new, prompt_tokens=prompt_len, new_tokens=len(new),
                       elapsed_s=elapsed, tokens_per_s=len(new) / elapsed if elapsed > 0 else 0.0,
                       finish_reason=finish, target_forwards=len(new) if one_forward_per_token else None)


class _ExternalSide:
    """Shared by the non-specstruct sides: same model object, same prompt tokens and EOS ids as the
    engine, and (by default) transformers' stock numerics, which is what users of these tools get."""

    name = "external"

    def __init__(self, engine: Any, settings: Settings, stock: bool = True, assistant: Any = None):
        self.engine, self.settings, self.stock, self.assistant = engine, settings, stock, assistant
        self.model, self.tokenizer, self.eos = engine.model, engine.tokenizer, eos_ids(engine)

    def _numerics_block(self) -> Any:
        return stock_numerics(self.model, self.assistant) if self.stock else nullcontext()

    def numerics(self) -> str:
        with self._numerics_block():
            desc = linear_numerics(self.model)
            if self.assistant is not None:
                desc += f"; assistant: {linear_numerics(self.assistant)}"
        return desc

    def prepare(self, workload: Workload) -> None:
        pass


class HFSide(_ExternalSide):
    """transformers `generate`, plain or with `assistant_model` (assisted generation), unconstrained."""

    def __init__(self, name: str, engine: Any, settings: Settings, assistant: Any = None, stock: bool = True):
        super().__init__(engine, settings, stock, assistant)
        self.name = name

    def measure(self, workload: Workload) -> Measurement:
        import torch

        ids = chat_ids(self.tokenizer, prompt_messages(self.engine, workload))
        kwargs = _generate_kwargs(self.tokenizer, self.eos, self.settings)
        if self.assistant is not None:
            kwargs["assistant_model"] = self.assistant
        torch.manual_seed(self.settings.seed)
        with self._numerics_block(), torch.inference_mode():
            start = time.perf_counter()
            out = self.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                      **kwargs)
            elapsed = time.perf_counter() - start
        return _measure_ids(self.name, self.tokenizer, self.eos, len(ids), out[0, len(ids):].tolist(), elapsed,
                            one_forward_per_token=self.assistant is None)


class OutlinesSide(_ExternalSide):
    """outlines 1.x on the same model object: `outlines.Generator(from_transformers(model, tok), type)`.
    Only constrained workloads run here (unconstrained outlines is plain `generate`, the hf side)."""

    name = "outlines"

    def __init__(self, engine: Any, settings: Settings, stock: bool = True):
        import outlines

        super().__init__(engine, settings, stock)
        padding = self.tokenizer.padding_side
        self.outlines_model = outlines.from_transformers(self.model, self.tokenizer)
        self.tokenizer.padding_side = padding  # outlines sets "left" on the shared tokenizer; batch 1 needs none
        self._generated: list[int] = []
        inner = self.outlines_model._generate_output_seq

        def capture(prompts: Any, inputs: Any, **kw: Any) -> Any:  # keep the ids outlines decodes
            ids = inner(prompts, inputs, **kw)
            self._generated = ids.reshape(-1).tolist()
            return ids

        self.outlines_model._generate_output_seq = capture
        self._generators: dict[str, Any] = {}
        self._warm = False

    def prepare(self, workload: Workload) -> None:
        """Build (compile) the generator for this output type, and warm outlines' mask kernels once."""
        import outlines
        from outlines.inputs import Chat

        if workload.id not in self._generators:
            self._generators[workload.id] = outlines.Generator(self.outlines_model, workload.outlines_type)
        if not self._warm:  # the first masked call compiles outlines_core's torch kernels (seconds)
            with self._numerics_block():
                self._generators[workload.id](Chat(workload.messages), max_new_tokens=2, do_sample=False,
                                              eos_token_id=self.eos)
            self._warm = True

    def measure(self, workload: Workload) -> Measurement:
        import torch
        from outlines.inputs import Chat

        self.prepare(workload)
        messages = prompt_messages(self.engine, workload)
        kwargs = _generate_kwargs(self.tokenizer, self.eos, self.settings)
        torch.manual_seed(self.settings.seed)
        with self._numerics_block():
            start = time.perf_counter()
            self._generators[workload.id](Chat(messages), **kwargs)
            elapsed = time.perf_counter() - start
        prompt_len = len(chat_ids(self.tokenizer, messages))
        return _measure_ids(self.name, self.tokenizer, self.eos, prompt_len, self._generated, elapsed, True)
