"""The parts the conformance harness swaps: tokenizer (tiny or Qwen), JSON backend (llguidance, outlines,
xgrammar, or `tools`: the schema as a tool's parameters, inside the tool-call grammar that the server and
langchain-specstruct use), and the per-schema measurements (compile time, peak memory, mask time per token).

Peak memory is the growth of the peak resident set (VmHWM, reset through /proc/PID/clear_refs before each
compile) of the harness worker and of specstruct's compile worker process, whichever grew most.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Sequence

BACKENDS = ("llguidance", "outlines", "xgrammar", "tools")
TOKENIZERS = {"tiny": None, "qwen": "qwen2.5-coder-1.5b"}


def load_tokenizer(name: str):
    """(tokenizer, vocab_size, eos_ids) for `tiny` (the 400-token test BPE, 408-row head) or `qwen`."""
    if name == "tiny":
        from specstruct.testing import tiny_tokenizer

        return tiny_tokenizer(), 408, [2]
    from specstruct.models import load_tokenizer as load

    tok = load(TOKENIZERS[name])
    return tok, 151_936, [tok.eos_token_id]  # Qwen2.5's LM head has 151,936 rows


class XGrammarConstraint:
    """Just enough of the Constraint Protocol to walk an XGrammar matcher (fork only from the start)."""

    def __init__(self, compiled, vocab_size: int, eos: Sequence[int]):
        import xgrammar as xgr

        self._cg, self.vocab_size, self._eos = compiled, vocab_size, list(eos)
        self._m = xgr.GrammarMatcher(compiled, override_stop_tokens=self._eos)
        self._bits = xgr.allocate_token_bitmask(1, vocab_size)

    def fork(self) -> "XGrammarConstraint":
        return XGrammarConstraint(self._cg, self.vocab_size, self._eos)

    def mask(self):
        import numpy as np

        self._m.fill_next_token_bitmask(self._bits)
        words = self._bits.numpy().view(np.uint8)
        return np.unpackbits(words, count=self.vocab_size, bitorder="little").view(np.bool_)

    def advance(self, tokens: Sequence[int]) -> int:
        n = 0
        for t in tokens:
            if not self._m.accept_token(int(t)):
                break
            n += 1
        return n

    def is_final(self) -> bool:
        return self._m.accept_token(self._eos[0]) if not self._m.is_terminated() else True


class ToolCallConstraint:
    """A tool-call grammar (specstruct.constraints.tools.grammar, tool_choice "required") seen as a constraint on the arguments alone:
    a fork starts after `<tool_call>\\n{"name": "f", "arguments": `, and it is final where the rest of the call
    (`}`, the closing marker) can follow. The markers are Qwen's added tokens where the tokenizer has them."""

    PREFIX, SUFFIX = '<tool_call>\n{"name": "f", "arguments": ', "}\n</tool_call>"

    def __init__(self, inner, tokenizer, started: bool = False):
        self._inner, self._tok, self.vocab_size = inner, tokenizer, inner.vocab_size
        if not started:
            ids = tokenizer.encode(self.PREFIX, add_special_tokens=False)
            if inner.advance(ids) != len(ids):
                raise RuntimeError("the tool-call grammar refused its own call prefix")

    def fork(self) -> "ToolCallConstraint":
        return ToolCallConstraint(self._inner.fork(), self._tok, started=True)

    def mask(self):
        return self._inner.mask()

    def advance(self, tokens: Sequence[int]) -> int:
        return self._inner.advance(tokens)

    def is_final(self) -> bool:
        probe, ids = self._inner.fork(), self._tok.encode(self.SUFFIX, add_special_tokens=False)
        return probe.advance(ids) == len(ids) and probe.is_final()


_XGR: dict[int, Any] = {}


def compile_schema(backend: str, schema: Any, tokenizer, vocab_size: int, eos: Sequence[int]):
    """A Constraint (or XGrammarConstraint) for `schema`; ConstraintError when refused."""
    if backend == "xgrammar":
        import xgrammar as xgr

        from specstruct.errors import ConstraintError

        if id(tokenizer) not in _XGR:
            info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=list(eos))
            _XGR[id(tokenizer)] = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        try:
            compiled = _XGR[id(tokenizer)].compile_json_schema(json.dumps(schema), any_whitespace=False,
                                                               separators=(", ", ": "), strict_mode=False)
        except Exception as e:  # noqa: BLE001 - XGrammar raises RuntimeError/ValueError for what it refuses
            raise ConstraintError(f"xgrammar: {type(e).__name__}: {e}".splitlines()[0][:300]) from e
        return XGrammarConstraint(compiled, vocab_size, eos)
    from specstruct.constraints.base import ConstraintSpec
    from specstruct.constraints.compiler import compile_constraint

    if backend == "tools":
        from specstruct.constraints.tools.grammar import tool_grammar

        grammar = tool_grammar([{"type": "function", "function": {"name": "f", "parameters": schema}}], "required",
                               tokenizer, parallel=False)
        inner = compile_constraint(ConstraintSpec("grammar", grammar), tokenizer, vocab_size=vocab_size,
                                   eos_token_ids=eos)
        return ToolCallConstraint(inner, tokenizer)
    return compile_constraint(ConstraintSpec("json", json.dumps(schema)), tokenizer, vocab_size=vocab_size,
                              eos_token_ids=eos, json_backend=backend)


def walk(constraint, ids: Sequence[int], mask_times: list[float] | None) -> bool:
    """Walk `ids` through a fork of `constraint`, timing each mask; True when all are legal and it is final."""
    c = constraint.fork()
    for t in ids:
        if mask_times is not None:
            start = time.perf_counter()
            c.mask()
            mask_times.append(time.perf_counter() - start)
        if c.advance([t]) != 1:
            return False
    return c.is_final()


def _status(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _pids() -> list[int]:
    from specstruct.constraints.outlines import isolate

    worker = isolate._STATE.get("w")
    return [os.getpid()] + ([worker.proc.pid] if worker is not None and worker.alive() else [])


def peak_begin() -> dict[int, int]:
    """Reset the peak RSS of this process and of the compile worker; their current RSS in kB."""
    base = {}
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
        base[pid] = _status(pid, "VmRSS")
    return base


def peak_end(base: dict[int, int]) -> float:
    """MB the peak RSS grew by since `peak_begin`, the larger of the two processes."""
    return round(max((_status(pid, "VmHWM") - base.get(pid, 0)) / 1024 for pid in _pids()), 1)


def percentiles(values: list[float], scale: float = 1.0, digits: int = 3) -> dict[str, float | None]:
    import numpy as np

    if not values:
        return {"p50": None, "p99": None, "max": None}
    a = np.asarray(values) * scale
    return {"p50": round(float(np.percentile(a, 50)), digits), "p99": round(float(np.percentile(a, 99)), digits),
            "max": round(float(a.max()), digits)}
