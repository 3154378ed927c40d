"""One local Ray cluster (2 CPUs, no dashboard) for the Ray tests, and the tiny models saved as folders so that
actors and replicas load them by name exactly as they would load a real model. Skipped without `ray`."""

from __future__ import annotations

import os

import pytest

SKIP_REASON = 'ray is not installed: pip install -e ".[ray]" to run the Ray tests'

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="session")
def ray_cluster():
    """Started once for all Ray test modules (startup takes ~10 s on 2 cores); shut down at the end."""
    ray = pytest.importorskip("ray", reason=SKIP_REASON)
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"PYTHONPATH": path, "TOKENIZERS_PARALLELISM": "false"}})
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_folders(tmp_path_factory, tok, target, close_draft):
    """(target folder, draft folder): the session's tiny models written with save_pretrained."""
    root = tmp_path_factory.mktemp("tiny-models")
    folders = []
    for name, model in (("target", target), ("draft", close_draft)):
        folder = root / name
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        folders.append(str(folder))
    return tuple(folders)
