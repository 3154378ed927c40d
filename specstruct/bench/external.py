"""The external sides: transformers `generate` (plain and assisted) and outlines 1.x, on the engine's own
model objects, fed the same prompt tokens and EOS ids as specstruct.

By default they run with transformers' stock numerics (what a user of those tools gets): the
row-invariant patches specstruct's runtime put on the model are lifted for their calls and restored
afterwards (`stock_numerics`).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

from specstruct.api.inputs import eos_token_ids
from specstruct.bench.measure import Measurement, Settings, chat_ids, prompt_messages
from specstruct.bench.fairness import linear_numerics
from specstruct.bench.workloads import Workload


@contextmanager
def stock_numerics(*models: Any) -> Iterator[None]:
    """Run a block with transformers' stock numerics on models that specstruct's runtime switched to
    row-invariant numerics (a user of outlines or plain transformers gets the stock ones). Afterwards the thread
    gives its OpenMP pool back (runtime/openmp.py), so the next specstruct side decodes unthrottled."""
    from specstruct.runtime.openmp import release_pool
    from specstruct.runtime.model_runtime import make_row_invariant, restore_stock
    from specstruct.runtime.owned import peek

    patched = [m for m in models if m is not None and peek(m).numerics]
    for m in patched:
        restore_stock(m)
    try:
        yield
    finally:
        for m in patched:
            make_row_invariant(m)
        release_pool()  # this thread computed: its OpenMP pool would slow specstruct's decode thread



def eos_ids(engine: Any) -> list[int]:
    """The ids that end a turn, exactly as the engine stops on them (so every side stops alike)."""
    ids = getattr(engine, "eos_token_ids", None)
    return list(ids) if ids else eos_token_ids(engine.tokenizer, engine.model)


def _generate_kwargs(tokenizer: Any, eos: list[int], s: Settings) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"max_new_tokens": s.max_new_tokens, "eos_token_id": eos,
                              "pad_token_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]}
    if s.temperature > 0:
        kwargs.update(do_sample=True, temperature=s.temperature, top_p=s.top_p)
    else:
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    return kwargs


@contextmanager
def count_forwards(model: Any) -> Iterator[list[int]]:
    """Count the target's forward passes (prefill included, as specstruct's `target_forwards` does)."""
    calls = [0]

    def hook(*_: Any) -> None:
        calls[0] += 1

    handle = model.register_forward_pre_hook(hook)
    try:
        yield calls
    finally:
        handle.remove()


def _measure_ids(name: str, tokenizer: Any, eos: list[int], prompt_len: int, out_ids: list[int], elapsed: float,
                 forwards: int) -> Measurement:
    """Batch size 1, so no padding: every returned id was generated (the final EOS included)."""
    new = [int(i) for i in out_ids]
    text = tokenizer.decode(new, skip_special_tokens=True)
    finish = "stop" if new and new[-1] in eos else "length"
    return Measurement(side=name, text=text, token_ids=new, prompt_tokens=prompt_len, new_tokens=len(new),
                       elapsed_s=elapsed, tokens_per_s=len(new) / elapsed if elapsed > 0 else 0.0,
                       finish_reason=finish, target_forwards=forwards,
                       tokens_per_forward=len(new) / forwards if forwards else None)


class _ExternalSide:
    """Shared by the non-specstruct sides: same model object, same prompt tokens and EOS ids as the
    engine, and (by default) transformers' stock numerics, which is what users of these tools get."""

    name = "external"

    def __init__(self, engine: Any, settings: Settings, stock: bool = True, assistant: Any = None):
        self.engine, self.settings, self.stock, self.assistant = engine, settings, stock, assistant
        self.model, self.tokenizer, self.eos = engine.model, engine.tokenizer, eos_ids(engine)

    def _numerics_block(self) -> Any:
        return stock_numerics(self.model, self.assistant) if self.stock else stock_numerics()  # releases its pool

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

    def measure(self, workload: Workload, repeat: int = 0) -> Measurement:  # no memory of earlier requests: `repeat` unused
        import torch

        ids = chat_ids(self.tokenizer, prompt_messages(self.engine, workload))
        kwargs = _generate_kwargs(self.tokenizer, self.eos, self.settings)
        if self.assistant is not None:
            kwargs["assistant_model"] = self.assistant
        torch.manual_seed(self.settings.seed)
        with self._numerics_block(), torch.inference_mode(), count_forwards(self.model) as calls:
            start = time.perf_counter()
            out = self.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                      **kwargs)
            elapsed = time.perf_counter() - start
        return _measure_ids(self.name, self.tokenizer, self.eos, len(ids), out[0, len(ids):].tolist(), elapsed,
                            calls[0])


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

    def measure(self, workload: Workload, repeat: int = 0) -> Measurement:  # no memory of earlier requests: `repeat` unused
        import torch
        from outlines.inputs import Chat

        self.prepare(workload)
        messages = prompt_messages(self.engine, workload)
        kwargs = _generate_kwargs(self.tokenizer, self.eos, self.settings)
        torch.manual_seed(self.settings.seed)
        with self._numerics_block(), count_forwards(self.model) as calls:
            start = time.perf_counter()
            self._generators[workload.id](Chat(messages), **kwargs)
            elapsed = time.perf_counter() - start
        prompt_len = len(chat_ids(self.tokenizer, messages))
        return _measure_ids(self.name, self.tokenizer, self.eos, prompt_len, self._generated, elapsed, calls[0])
