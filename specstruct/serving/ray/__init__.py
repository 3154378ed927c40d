"""Scale-out on Ray (`pip install "specstruct[ray]"`): bulk extraction over Ray Datasets and OpenAI-compatible
serving replicas on Ray Serve. See docs/scale-out.md.

    from specstruct.serving.ray import extract, build_app

Importing this package does not import ray; each entry point does, and says how to install it when it is missing.
"""

from specstruct.serving.ray.engines import EngineFactory, Pretrained, engine_factory
from specstruct.serving.ray.extract import RESULT_COLUMNS, extract

__all__ = ["extract", "EngineFactory", "Pretrained", "engine_factory", "RESULT_COLUMNS"]
