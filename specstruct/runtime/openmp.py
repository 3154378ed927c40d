"""OpenMP worker pools across threads: a thread that stops computing gives its pool back.

torch's CPU kernels run on OpenMP, and GNU OpenMP (libgomp, which the Linux torch wheels ship) keeps one pool of
worker threads per thread that ever ran a parallel region. The models run on the scheduler's thread, so a process
that loaded its model (or ran any torch op) on its main thread holds two pools. Once libgomp manages more threads
than there are CPUs it stops spin-waiting between parallel regions (`gomp_throttled_spin_count_var`: 100 spins
instead of 300,000) and every region boundary becomes a futex sleep and wake-up; a decode step is thousands of
small regions. Measured on the 2-core machine, Qwen2.5-Coder-1.5B + 0.5B int8 draft, one JSON extraction
(`python -m benchmarks.decode_thread`; docs/benchmarks.md, "The decode thread"): 9.8-10.1 s on a second
thread while the main thread's pool lives, against 5.9-7.3 s on the main thread; 6.0-7.2 s on the second thread
once the main thread's pool was released.

`release_pool()` frees the calling thread's pool (libgomp's `omp_pause_resource_all`, OpenMP 5.0); its next
parallel region builds a new one (well under a millisecond). It runs on the loading thread after `SpecStruct(...)`,
on a thread that compiled a constraint (token tables over a 151k vocabulary run parallel regions: a server
compiles on worker threads), on each submitting thread, on the scheduler when it goes idle, and on the KV helper
threads after each job, so only the thread that computes holds a pool. Where torch does not use libgomp (other
platforms, Intel OpenMP) it does nothing.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Callable, ParamSpec, TypeVar

_lock = threading.Lock()
_pause: Callable[[int], int] | None = None
_resolved = False
OMP_PAUSE_SOFT = 1


def _libgomp_paths() -> list[str]:
    try:
        with open("/proc/self/maps") as maps:
            return sorted({line.split()[-1] for line in maps if "libgomp" in line.rsplit("/", 1)[-1]})
    except OSError:  # not Linux
        return []


def _resolve() -> Callable[[int], int] | None:
    """`omp_pause_resource_all` of the libgomp torch loaded, or None."""
    global _pause, _resolved
    if _resolved:
        return _pause
    with _lock:
        if not _resolved:
            import torch  # noqa: F401 - its libgomp must be loaded to be found

            for path in _libgomp_paths():
                try:
                    fn = ctypes.CDLL(path).omp_pause_resource_all
                except (OSError, AttributeError):
                    continue
                fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
                _pause = fn
                break
            _resolved = True
        return _pause


def release_pool() -> bool:
    """Free the calling thread's OpenMP worker threads. True when there was a libgomp to ask (it returns nonzero,
    harmlessly, inside a parallel region)."""
    fn = _resolve()
    if fn is None:
        return False
    fn(OMP_PAUSE_SOFT)
    return True


_P = ParamSpec("_P")
_R = TypeVar("_R")


def releasing(job: Callable[_P, _R]) -> Callable[_P, _R]:
    """`job` run by a helper thread, which gives its pool back afterwards."""

    def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return job(*args, **kwargs)
        finally:
            release_pool()

    return run
