"""Scale-out on Ray (`pip install "specstruct[ray]"`): bulk extraction over Ray Datasets and OpenAI-compatible
serving replicas on Ray Serve. See docs/scale-out.md.

    from specstruct.serving.ray import extract, build_app

Importing this package does not import ray; `extract` imports it when called, `build_app` when first reached.
"""

from typing import Any

from specstruct.serving.ray.engines import EngineFactory, Pretrained, engine_factory
from specstruct.serving.ray.extract import RESULT_COLUMNS, RowLimitError, RowLimits, extract

__all__ = ["extract", "build_app", "EngineFactory", "Pretrained", "engine_factory", "RESULT_COLUMNS", "RowLimits",
           "RowLimitError"]


def __getattr__(name: str) -> Any:
    if name == "build_app":
        from specstruct.serving.ray.engines import require_ray

        require_ray()
        from specstruct.serving.ray.serve import build_app

        return build_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
