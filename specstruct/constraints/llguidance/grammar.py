"""Lark grammars through llguidance: an LLMatcher is the state, `deep_copy` forks it, `rollback` undoes.

llguidance owns the parser state; we only keep track of the EOS tokens we let through ourselves
(any of the model's EOS ids is legal exactly where the matcher is accepting), so rollback knows how
many real tokens to hand back to the matcher.
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch

from specstruct.constraints.base import bitmask_words, output_text, pack_mask, unpack_words
from specstruct.constraints.cache import ByteLRU
from specstruct.constraints.limits import limits, llguidance_limit, llguidance_limits
from specstruct.constraints.llguidance import grammar_worker
from specstruct.constraints.llguidance.bounded import COMPILING, compile_here, panic, run_bounded
from specstruct.constraints.llguidance.grammar_probe import trusted
from specstruct.errors import ConstraintError

if TYPE_CHECKING:
    from llguidance import LLMatcher

_LLTOKENIZERS: dict[tuple, object] = {}
_TEMPLATES = ByteLRU(lambda: limits().cache_mb << 20)  # grammars kept in this process, compiled (see _template)
_LOCK = threading.Lock()


def _lltokenizer(tokenizer, table, vocab_size: int):
    key = (table.key, vocab_size)
    with _LOCK:
        if key not in _LLTOKENIZERS:
            import llguidance.hf

            try:
                with COMPILING:
                    _LLTOKENIZERS[key] = llguidance.hf.from_tokenizer(tokenizer,
                                                                      n_vocab=max(vocab_size, table.n_real))
            except ValueError as e:
                raise ConstraintError(f"grammars need a fast (Rust) Hugging Face tokenizer: {e}") from e
        return _LLTOKENIZERS[key]


def _special_ids(tokenizer, vocab_size: int, lark: str = "") -> np.ndarray:
    """The special ids no mask lets through: all of them, except those the grammar names as tokens (`<tool_call>`
    or `<[151657]>`), which llguidance allows only where the grammar puts them."""
    from specstruct.constraints.outlines.token_table import token_table

    special = token_table(tokenizer).eos_like
    named = {int(i) for i in special if f"<[{int(i)}]>" in lark
             or _named(tokenizer.convert_ids_to_tokens(int(i)), lark)}
    return np.array([i for i in special if i < vocab_size and int(i) not in named], dtype=special.dtype)


def _named(token: Any, lark: str) -> bool:
    return isinstance(token, str) and token.startswith("<") and token.endswith(">") and token in lark


def _limit_error(error: str) -> ConstraintError:
    """llguidance stopped while generating: name the limit that raises it, or say it is a dead end."""
    error = " ".join(error.replace("<non-verbose/>", "").split())[:300]
    hit = llguidance_limit(error)
    if hit is None:  # e.g. NoExtensionBias: the grammar let the output reach a state nothing can follow
        return ConstraintError(f"the constraint failed while generating: {error}. The output reached a state of the "
                               "schema or grammar that no token can extend (a dead end); simplify it (for example "
                               "fewer interacting minProperties/required/dependencies rules).")
    return ConstraintError(
        f"the constraint failed while generating: {error}. The schema or grammar is too complex for {hit[0]}: "
        f"simplify it (simpler patterns, fewer optional properties or alternatives); it hit the "
        f"{limits().describe(hit[1])}.")


def build_matcher(lark: str, lltok) -> Any:
    """An LLMatcher of the Lark grammar `lark`, or ConstraintError saying what is wrong with it."""
    from llguidance import LLMatcher

    try:
        grammar = LLMatcher.grammar_from_lark(lark)
    except (ValueError, RuntimeError) as e:
        raise panic("the grammar", str(e)) or ConstraintError(f"invalid Lark grammar: {e}") from None
    error = LLMatcher.validate_grammar(grammar, lltok, limits=llguidance_limits())
    if error and (known := panic("the grammar", error)):
        raise known
    if error:
        raise ConstraintError(f"invalid Lark grammar: {error.strip()}\nFix the rule named above (llguidance "
                              "Lark syntax, see https://github.com/guidance-ai/llguidance/blob/main/docs/syntax.md).")
    matcher = LLMatcher(lltok, grammar, log_level=0, limits=llguidance_limits())
    if matcher.is_error():
        raise panic("the grammar", matcher.get_error()) or ConstraintError(
            f"invalid Lark grammar: {matcher.get_error()}")
    return matcher


def _template(lark: str, lltok, tokenizer_key: tuple) -> "LLMatcher":
    """The matcher at the start of a grammar kept in this process (one specstruct wrote: the tool-call grammar),
    compiled once per tokenizer and limits, after a trial in a child under the compile limits (bounded.compile_here);
    each request gets a deep copy. Cached by bytes with the compiled schemas' budget (`cache_mb`)."""
    key = (*tokenizer_key, lark, limits().lexer_fuel, limits().memory_mb)  # a template keeps its limits
    template = _TEMPLATES.get(key)
    if template is None:
        what = "the tool-call grammar" if trusted(lark) else "the grammar"
        template = compile_here(lambda: build_matcher(lark, lltok), what)
        _TEMPLATES.put(key, template, 64 * 1024 + 64 * len(lark))
    return template


def check_lark(lark: str) -> None:
    """Refuse a Lark grammar llguidance cannot compile (ConstraintError), without a tokenizer, under the compile
    limits (bounded.py): cheap enough to run before a model loads."""
    from llguidance import LLMatcher

    def check() -> str:
        try:
            return LLMatcher.validate_grammar(LLMatcher.grammar_from_lark(lark))
        except (ValueError, RuntimeError) as e:
            return str(e)

    error = run_bounded(check, "the grammar")
    if error:
        raise panic("the grammar", error) or ConstraintError(f"invalid Lark grammar: {error.strip()}")


class _WordRules:
    """What a mask does to llguidance's words, as words: `keep` clears the special ids, the EOS ids and the bits past
    the vocabulary; `eos` sets the EOS ids (where the output is final). `raw` is llguidance's own word count (its
    tokenizer may count more tokens than the LM head)."""

    def __init__(self, vocab_size: int, special: tuple[int, ...], eos: tuple[int, ...], raw: int):
        cleared = np.zeros(bitmask_words(vocab_size) * 32, dtype=np.bool_)
        cleared[vocab_size:] = True
        cleared[list(special)] = True
        cleared[list(eos)] = True
        self.keep = ~pack_mask(torch.from_numpy(cleared))
        allowed = np.zeros(vocab_size, dtype=np.bool_)
        allowed[list(eos)] = True
        self.eos = pack_mask(torch.from_numpy(allowed))
        self.raw = raw


@functools.lru_cache(maxsize=64)
def _word_rules(vocab_size: int, special: tuple[int, ...], eos: tuple[int, ...], raw: int) -> _WordRules:
    """One set of rules per vocabulary, special ids and EOS ids: shared by every request's constraint."""
    return _WordRules(vocab_size, special, eos, raw)


class GrammarConstraint:
    """A Lark grammar (llguidance syntax: `start: ...`, regex terminals `/.../`, %json {...})."""

    def __init__(self, matcher, tokenizer, vocab_size: int, eos_ids: Sequence[int], mode: str,
                 stack: list[bool] | None = None, special: np.ndarray | None = None, keys: tuple[str, ...] = (),
                 rules: _WordRules | None = None):
        self._m, self._tokenizer, self.vocab_size, self.mode = matcher, tokenizer, vocab_size, mode
        self.keys = keys  # a JSON schema's property names in the order it declares them (drafting guesses the next)
        self._eos = sorted({int(e) for e in eos_ids if 0 <= int(e) < vocab_size})
        self._stack = stack if stack is not None else []  # True: an EOS we accepted; False: a real token
        self._special = _special_ids(tokenizer, vocab_size) if special is None else special
        self._rules = rules  # made at the first bitmask, shared by the forks

    @classmethod
    def compile(cls, lark: str, tokenizer, table, vocab_size: int, eos_ids: Sequence[int], mode: str):
        """A user's grammar is compiled in its own child process (grammar_worker.compile_isolated: bounded by the
        compile limits, its matcher kept there); one specstruct wrote itself (grammar_probe.trust), in-process."""
        lltok = _lltokenizer(tokenizer, table, vocab_size)
        if grammar_worker.available() and not trusted(lark):
            matcher = grammar_worker.compile_isolated(lambda: build_matcher(lark, lltok), "the grammar")
        else:
            matcher = _template(lark, lltok, (table.key, vocab_size)).deep_copy()
        return cls(matcher, tokenizer, vocab_size, eos_ids, mode, special=_special_ids(tokenizer, vocab_size, lark))

    def _done(self) -> bool:
        return bool(self._stack) and self._stack[-1]

    def mask(self) -> torch.Tensor:
        words = torch.empty(bitmask_words(self.vocab_size), dtype=torch.int32)
        self.fill_bitmask(words)
        return unpack_words(words, self.vocab_size)

    def fill_bitmask(self, out: torch.Tensor) -> None:
        """llguidance's words written straight into `out` (int32 [bitmask_words(vocab_size)]), then the special ids
        cleared (llguidance may allow its own EOS: only ours, only when final) and our EOS ids set where final."""
        if not self._done() and self._m.is_error():  # stopped by a limit or a dead end: never a silent "stop"
            raise _limit_error(self._m.get_error())
        rules = self._word_rules()
        if self._done() or self._m.is_stopped():
            out.zero_()
        else:
            self._fill_raw(out, rules.raw)
            if self._m.is_error():  # a parser limit hit mid-output: fail loudly, never unconstrained
                raise _limit_error(self._m.get_error())
            out &= rules.keep
        if self.is_final():
            out |= rules.eos

    def _fill_raw(self, out: torch.Tensor, raw: int) -> None:
        from llguidance import LLMatcher

        if isinstance(self._m, LLMatcher) and raw == out.numel() and out.is_contiguous():
            self._m.unsafe_compute_mask_ptr(out.data_ptr(), raw * 4)  # in place, the GIL released
            return
        packed = np.frombuffer(self._m.compute_bitmask(), dtype=np.uint8)  # a matcher in its child: bytes
        dest = out.view(torch.uint8).numpy()
        n = min(len(packed), len(dest))
        dest[:n] = packed[:n]
        dest[n:] = 0

    def _word_rules(self) -> _WordRules:
        if self._rules is None:
            from specstruct.constraints.outlines.token_table import token_table

            raw = bitmask_words(max(self.vocab_size, token_table(self._tokenizer).n_real))  # as _lltokenizer counts
            self._rules = _word_rules(self.vocab_size, tuple(int(i) for i in self._special), tuple(self._eos), raw)
        return self._rules

    def advance(self, tokens: Sequence[int]) -> int:
        n = 0
        for t in (int(t) for t in tokens):
            if t in self._eos:
                if not self.is_final():
                    break
                self._stack.append(True)
            elif self._done() or not (0 <= t < self.vocab_size) or self._m.validate_tokens([t]) != 1:
                break
            else:
                self._m.consume_token(t)
                self._stack.append(False)
            n += 1
        return n

    def rollback(self, n: int) -> None:
        if n < 0 or n > len(self._stack):
            raise ValueError(f"cannot roll back {n} tokens: only {len(self._stack)} were consumed")
        if n:
            real = sum(1 for eos in self._stack[-n:] if not eos)
            del self._stack[-n:]
            if real and not self._m.rollback(real):
                raise RuntimeError(f"llguidance could not roll back {real} tokens: {self._m.get_error()}")

    def forced_text(self) -> str:
        if self._done():
            return ""
        data = bytes(self._m.compute_ff_bytes())
        import codecs

        return codecs.getincrementaldecoder("utf-8")(errors="replace").decode(data, final=False)

    def is_final(self) -> bool:
        return self._done() or self._m.is_accepting()

    def fork(self) -> "GrammarConstraint":
        return GrammarConstraint(self._m.deep_copy(), self._tokenizer, self.vocab_size, self._eos, self.mode,
                                 list(self._stack), self._special, self.keys, self._word_rules())

    def accepts(self, text: str) -> bool:
        ids = self._tokenizer.encode(output_text(text), add_special_tokens=False, split_special_tokens=True)
        probe = self.fork()
        return probe.advance(ids) == len(ids) and probe.is_final()
