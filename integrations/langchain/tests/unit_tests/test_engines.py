"""The shared engine table: loading one engine never stalls calls on engines already loaded,
the same key loads once, and the per-engine locks go away with their engines."""

from __future__ import annotations

import gc
import threading

import pytest

from langchain_specstruct import _engines


class _Engine:
    pass


@pytest.fixture
def slow_load(monkeypatch):
    import specstruct as ss

    started, release, calls = threading.Event(), threading.Event(), []

    def from_pretrained(model, draft=None, config=None):
        calls.append(model)
        started.set()
        release.wait(10)
        return _Engine()

    monkeypatch.setattr(ss.SpecStruct, "from_pretrained", staticmethod(from_pretrained))
    yield started, release, calls
    release.set()
    _engines.clear_engines()


def test_loading_does_not_stall_locks_of_loaded_engines(slow_load):
    started, release, calls = slow_load
    key = _engines.EngineKey("slow-model", None, "cpu", "float32")
    loaders = [threading.Thread(target=_engines.get_engine, args=(key,)) for _ in range(2)]
    for t in loaders:
        t.start()
    assert started.wait(5)
    got = []
    probe = threading.Thread(target=lambda: got.append(_engines.engine_lock(_Engine())))
    probe.start()
    probe.join(2)
    assert got, "engine_lock waited for another engine's weights to load"
    release.set()
    for t in loaders:
        t.join(5)
    assert calls == ["slow-model"]  # two callers, one load


def test_engine_locks_are_dropped_with_their_engines():
    before = len(_engines._LOCKS)
    engine = _Engine()
    lock = _engines.engine_lock(engine)
    assert _engines.engine_lock(engine) is lock and len(_engines._LOCKS) == before + 1
    del engine
    gc.collect()
    assert len(_engines._LOCKS) == before
