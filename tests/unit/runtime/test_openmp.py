"""Only the computing thread keeps an OpenMP worker pool (runtime/openmp.py): release_pool frees the calling
thread's workers, and the scheduler releases the submitting thread's pool and its own when it goes idle."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

import specstruct as ss
import specstruct.engine.scheduler as scheduler_mod
from specstruct.runtime import openmp


def _tasks() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_release_pool_frees_the_calling_threads_workers():
    if not openmp._libgomp_paths() or (os.cpu_count() or 1) < 2:
        pytest.skip("torch does not run on libgomp here, or there is one CPU")
    seen: dict[str, int] = {}
    threads = torch.get_num_threads()  # the suite runs on 1 (conftest); this thread needs a pool of >= 2

    def work():
        torch.set_num_threads(2)
        try:
            _work()
        finally:
            torch.set_num_threads(threads)  # also what threads started later inherit

    def _work():
        a = torch.randn(512, 512)
        for _ in range(3):
            a = torch.tanh(a @ a)  # parallel regions: this thread gets its own pool of workers
        seen["with_pool"] = _tasks()
        seen["released"] = openmp.release_pool()
        end = time.monotonic() + 5
        while _tasks() >= seen["with_pool"] and time.monotonic() < end:
            time.sleep(0.01)
        seen["after"] = _tasks()
        torch.tanh(a @ a)  # the next region builds a pool again and computes as before
        seen["again"] = _tasks()

    t = threading.Thread(target=work)
    t.start()
    t.join(60)
    assert seen["released"] is True
    assert seen["after"] < seen["with_pool"]  # its workers exited
    assert seen["again"] > seen["after"]


def test_release_pool_outside_linux_libgomp_is_a_no_op(monkeypatch):
    monkeypatch.setattr(openmp, "_resolved", True)
    monkeypatch.setattr(openmp, "_pause", None)
    assert openmp.release_pool() is False
    assert openmp.releasing(lambda x: x + 1)(1) == 2


def test_scheduler_releases_the_submitters_pool_and_its_own_when_idle(tok, target, monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(scheduler_mod, "release_pool", lambda: calls.append(threading.current_thread().name))
    with ss.SpecStruct(target, tok, batch_config={"timeout_ms": 0}) as e:
        e.generate("Say yes or no.", ss.Choice(["yes", "no"]), max_new_tokens=4)
        e.generate("Again.", ss.Choice(["yes", "no"]), max_new_tokens=4)
        end = time.monotonic() + 10
        while calls.count("specstruct-scheduler") < 2 and time.monotonic() < end:
            time.sleep(0.01)  # after its last row the loop releases before it waits
    assert calls.count(threading.current_thread().name) >= 2  # each submit, from the caller's thread
    assert calls.count("specstruct-scheduler") >= 2  # idle before the first request, and after each


def test_building_an_engine_releases_the_loading_threads_pool(tok, target, monkeypatch):
    import specstruct.api.specstruct as api

    calls: list[str] = []
    monkeypatch.setattr(api, "release_pool", lambda: calls.append(threading.current_thread().name))
    with ss.SpecStruct(target, tok):
        assert calls == [threading.current_thread().name]


def test_compiling_a_constraint_releases_the_callers_pool(tok, target, monkeypatch):
    import specstruct.api.specstruct as api

    with ss.SpecStruct(target, tok) as e:
        calls: list[str] = []
        monkeypatch.setattr(api, "release_pool", lambda: calls.append("released"))
        e.constraint(ss.Regex("[ab]{3}"))  # a server compiles on a worker thread that never submits
        assert calls == ["released"]
