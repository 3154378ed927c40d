"""The engine of one model pair, built in one place.

`build` makes every part a request passes through after the API: the runtimes (the target, and the draft in its
CPU numerics), the speculator (proposers and the policy the requests share), the KV memory (one prefix cache for
both models, namespaced by model and numerics; the spill store; the active-tier budget and preemption) and the
scheduler whose thread drives them. `SpecStruct` composes one `Engine`; nothing else assembles these parts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from specstruct.config import BatchConfig, EngineConfig, SpecConfig
from specstruct.engine.preempt import Preemption
from specstruct.engine.scheduler import DecoderFactory, Scheduler
from specstruct.runtime.kv.memory import KVBudget, build as build_kv_tiers, close_all
from specstruct.runtime.kv.prefix_cache import PrefixCache
from specstruct.runtime.kv.store import KVStore
from specstruct.runtime.draft_head import HeadRestricted
from specstruct.runtime.model_runtime import ModelRuntime, quantize_draft
from specstruct.runtime.half_linear import is_half
from specstruct.runtime.quantized import is_quantized
from specstruct.spec.interfaces import Runtime
from specstruct.spec.speculator import Speculator


@dataclass(frozen=True)
class Engine:
    """The parts, each owned here once. Callers submit through `scheduler`; only its thread runs the models."""

    speculator: Speculator
    scheduler: Scheduler
    prefix_cache: PrefixCache
    kv_store: KVStore
    kv_budget: KVBudget
    preemption: Preemption
    draft_model: torch.nn.Module | None  # as the engine computes it (int8 where draft_numerics asked for it)

    @property
    def numerics(self) -> str:
        return str(self.speculator.numerics)

    def cache_info(self) -> dict[str, Any]:
        return dict(self.prefix_cache.info(), preemption=self.preemption.info())

    def close(self) -> None:
        """Stop the scheduler (waiting and running requests fail), then free the KV tiers and their spill files."""
        close_all(self.scheduler.close, self.prefix_cache.close, self.kv_store.close)


def build(model: torch.nn.Module, tokenizer: Any, eos_token_ids: Sequence[int], draft_model: torch.nn.Module | None,
          config: SpecConfig, engine_config: EngineConfig, batch_config: BatchConfig, *,
          decoder: DecoderFactory | None = None, target: Runtime | None = None) -> Engine:
    """An engine over `model` (and `draft_model`, whose vocabulary must already match), built with `engine_config`;
    `config` is what the shared policy plans a call with when the call brings none. `decoder` replaces the
    scheduler's row decoder and `target` the target's runtime (test doubles: testing.scripted_engine)."""
    device = next(model.parameters()).device
    runtime: Runtime = target or ModelRuntime(model)
    draft_rt: Runtime | None = None
    if draft_model is not None:
        if engine_config.draft_numerics == "int8" and next(draft_model.parameters()).device.type == "cpu" \
                and not is_quantized(draft_model) and not is_half(draft_model):  # a GGUF draft computes as it ships
            draft_model = quantize_draft(draft_model)
        draft_rt = ModelRuntime(draft_model)
        if engine_config.draft_head_tokens:  # the draft's head over the frequent token ids only
            draft_rt = HeadRestricted(draft_rt, engine_config.draft_head_tokens)
    prefix_cache, kv_store = build_kv_tiers(engine_config.prefix_cache_bytes, engine_config.kv_memory, device)
    budget = KVBudget(engine_config.kv_memory.active_bytes, model, draft_model)
    speculator = Speculator(runtime, tokenizer, eos_token_ids, draft=draft_rt, config=config,
                            prefix_cache=prefix_cache)
    # past kv_memory.active_bytes (all running rows) the newest rows pause, their KV spilled to kv_store
    preemption = Preemption(budget, kv_store)
    scheduler = Scheduler(speculator, batch_config, decoder, preemption=preemption)
    return Engine(speculator, scheduler, prefix_cache, kv_store, budget, preemption, draft_model)
