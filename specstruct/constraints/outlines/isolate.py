"""Build an outlines_core Index in a warm worker process, under the time and memory limits (limits.py).

The worker (_index_worker.py) is a plain script started once per process with `sys.executable`; it keeps
each tokenizer's Vocabulary, so a request ships only the regex and gets back the serialized Index. Past
`time_s` the worker is killed (by its own pid) and restarted on the next request; a compile that exhausts
`memory_mb` dies or fails inside the worker. Either way the caller gets a ConstraintError naming the limit;
the parent process never runs the native compile itself. Requests are serialised by a lock: one worker,
one compile at a time (a hostile schema holds others back for at most `time_s`).
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from specstruct.constraints.limits import limits, too_complex
from specstruct.constraints.outlines.token_table import TERMINATOR, TERMINATOR_ID, TokenTable

_WORKER = Path(__file__).with_name("_index_worker.py")


class _Worker:
    def __init__(self, memory_mb: int):
        # the child's environment: this one passed on whole, plus glibc's and Rayon's variables (not specstruct
        # settings) for the native code it runs
        env = {**os.environ, "MALLOC_ARENA_MAX": "2", "RAYON_NUM_THREADS": "1"}
        self.memory_mb, self.owner = memory_mb, os.getpid()
        self.proc = subprocess.Popen([sys.executable, str(_WORKER), str(memory_mb)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env)
        self.vocabs: set[str] = set()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def call(self, msg, deadline: float):
        """Send `msg`, wait for the answer until `deadline`; None when the worker died or timed out."""
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self.proc.stdin.write(struct.pack(">Q", len(data)) + data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        fd = self.proc.stdout.fileno()
        buf = bytearray()
        need = 8
        while len(buf) < need:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return "timeout"
            chunk = os.read(fd, max(need - len(buf), 1 << 20) if need > 8 else 8 - len(buf))
            if not chunk:
                return None
            buf += chunk
            if need == 8 and len(buf) >= 8:
                need = 8 + struct.unpack(">Q", bytes(buf[:8]))[0]
        return pickle.loads(bytes(buf[8:need]))


_LOCK = threading.Lock()
_STATE: dict[str, _Worker] = {}


def _vocab_message(table: TokenTable):
    by_bytes: dict[bytes, list[int]] = {TERMINATOR: [TERMINATOR_ID]}
    for i, b in enumerate(table.token_bytes):
        if b and TERMINATOR not in b:
            by_bytes.setdefault(b, []).append(i)
    return ("vocab", table.key, table.eos_id, by_bytes)


def build_index_bytes(regex: str, table: TokenTable, what: str) -> bytes:
    """The serialized outlines_core Index of `regex` (already wrapped) over `table`, built in the worker.
    Raises ConstraintError past the limits, ValueError with outlines_core's message for a bad regex."""
    lim = limits()
    with _LOCK:
        worker = _STATE.get("w")
        if worker is not None and worker.owner != os.getpid():
            worker = None  # inherited through fork(): its pipes belong to the parent, leave it alone
        if worker is None or not worker.alive() or worker.memory_mb != lim.memory_mb:
            if worker is not None:
                worker.kill()
            worker = _STATE["w"] = _Worker(lim.memory_mb)
        start = time.monotonic()
        deadline = start + lim.time_s
        reply = None
        if table.key not in worker.vocabs:
            reply = worker.call(_vocab_message(table), start + max(lim.time_s, 60.0))
            if not (isinstance(reply, tuple) and reply[0] == "ok"):
                worker.kill()
                _STATE.pop("w", None)
                raise too_complex(what, "memory_mb", "the compile worker could not load the vocabulary")
            worker.vocabs.add(table.key)
        reply = worker.call(("index", table.key, regex), deadline)
        if isinstance(reply, tuple) and reply[0] == "ok":
            return reply[1]
        if isinstance(reply, tuple) and reply[0] == "error":
            raise ValueError(reply[1])
        worker.kill()
        _STATE.pop("w", None)
        if reply == "timeout":
            raise too_complex(what, "time_s", f"compiling ran past {lim.time_s:g} s and was stopped")
        raise too_complex(what, "memory_mb", f"compiling needed more than {lim.memory_mb} MB and was stopped")


def shutdown() -> None:
    """Stop the worker (it is restarted on demand)."""
    with _LOCK:
        worker = _STATE.pop("w", None)
        if worker is not None:
            worker.kill()
