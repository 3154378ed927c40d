"""SerialBatchDecoder: the BatchDecoder interface over today's one-sequence `Decode` iterator.

The target runtime holds one KV cache per engine, so rows cannot be interleaved: `step()` advances only the
oldest admitted row, to completion, before the next one starts. It is correct (each row decodes exactly as it
would alone) but not concurrent; `decoding/batch.py`'s BatchDecoder steps every row in one packed pass.
"""

from __future__ import annotations

from typing import Iterator

from .engine import Decode, Engine


class SerialBatchDecoder:
    """Same interface as `decoding.batch.BatchDecoder`: add / remove / step / len."""

    def __init__(self, engine: Engine, **_: object):
        self.engine = engine
        self._rows: list[Decode] = []
        self._iters: dict[int, Iterator[list[int]]] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, row: Decode) -> None:
        self._rows.append(row)

    def remove(self, row: Decode) -> None:
        if row in self._rows:
            self._rows.remove(row)
        it = self._iters.pop(id(row), None)
        if it is not None:
            it.close()  # runs the Decode's `finally` (its stats); the next row's prefill resets the cache

    def step(self) -> list[tuple[Decode, list[int], bool]]:
        """One step of the oldest row: (row, tokens committed, finished). A failed row is finished, row.error set."""
        if not self._rows:
            return []
        row = self._rows[0]
        it = self._iters.get(id(row))
        if it is None:
            it = self._iters[id(row)] = iter(row)
        try:
            return [(row, list(next(it)), False)]
        except StopIteration:
            return [(row, [], True)]
        except Exception as err:  # noqa: BLE001 - the row fails alone; the scheduler raises it in its caller
            row.error = err
            return [(row, [], True)]
