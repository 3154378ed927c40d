"""The compile worker: builds outlines_core Indexes under an address-space limit, one request at a time.

Run as a script (`python _index_worker.py MEMORY_MB`) by isolate.py: it imports nothing of specstruct, so
it starts in a fraction of a second. Messages on stdin/stdout are 8-byte big-endian lengths + pickles:

    request  ("vocab", key, eos_id, {bytes: [ids]})  -> ("ok", None)
    request  ("index", key, regex)                  -> ("ok", index_bytes) | ("error", message)

index_bytes are outlines_core's own serialisation (`Index.from_binary` reads them back without unpickling), which is
what the disk cache stores.

A compile that runs out of memory either raises MemoryError (answered as an error) or aborts the process,
which the parent sees as a closed pipe.
"""

import os
import pickle
import resource
import struct
import sys


def _vm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _read(stream):
    head = stream.read(8)
    if len(head) < 8:
        return None
    return pickle.loads(stream.read(struct.unpack(">Q", head)[0]))


def _write(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack(">Q", len(data)) + data)
    stream.flush()


def main() -> None:
    from outlines_core import Index, Vocabulary

    budget = int(float(sys.argv[1]) * 2**20)
    limit = _vm_bytes() + budget
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write to the protocol stream
    vocabs: dict = {}
    while True:
        msg = _read(inp)
        if msg is None:
            return
        try:
            if msg[0] == "vocab":
                _, key, eos_id, by_bytes = msg
                vocabs[key] = Vocabulary(eos_id, by_bytes)
                _write(out, ("ok", None))
            else:
                _, key, regex = msg
                index = Index(regex, vocabs[key])
                _write(out, ("ok", bytes(index.__reduce__()[1][0])))  # (Index.from_binary, (bytes,))
        except MemoryError:
            _write(out, ("memory", "MemoryError"))
        except Exception as e:  # noqa: BLE001 - reported to the parent, which raises ConstraintError
            _write(out, ("error", f"{type(e).__name__}: {e}"))


if __name__ == "__main__":
    # Rayon's variable (not a specstruct setting), read by outlines_core's thread pool when it starts
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    main()
