"""The shared engine table: loading one engine never stalls calls on engines already loaded, and the same key
loads once."""

from __future__ import annotations

import threading

import pytest

from langchain_specstruct import _engines


class _Engine:
    pass


@pytest.fixture
def slow_load(monkeypatch):
    import specstruct as ss

    started, release, calls = threading.Event(), threading.Event(), []

    def from_pretrained(model, draft=None, engine_config=None):
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
    _engines._ENGINES[loaded := _engines.EngineKey("loaded", None, "cpu", "float32")] = engine = _Engine()
    got = []
    probe = threading.Thread(target=lambda: got.append(_engines.get_engine(loaded)))
    probe.start()
    probe.join(2)
    assert got == [engine], "a loaded engine waited for another engine's weights to load"
    release.set()
    for t in loaders:
        t.join(5)
    assert calls == ["slow-model"]  # two callers, one load
