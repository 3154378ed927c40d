"""Constraints that admit nothing, NUL in regexes, and the disk cache key."""

from __future__ import annotations

import pytest

import specstruct as ss
from specstruct import settings
from specstruct.constraints import compiler
from specstruct.constraints.base import ConstraintSpec
from specstruct.testing import run_alone, scripted_engine, tiny_tokenizer


def _compile(spec: ConstraintSpec):
    tok = tiny_tokenizer()
    return compiler.compile_constraint(spec, tok, vocab_size=len(tok) + 8, eos_token_ids=[tok.eos_token_id])


def test_a_grammar_that_matches_nothing_is_a_constraint_error():
    with pytest.raises(ss.ConstraintError, match="admits no output"):
        _compile(ConstraintSpec("grammar", r"start: /[^\s\S]/"))


def test_a_dead_end_during_decoding_is_a_constraint_error_not_token_0():
    engine = scripted_engine("ab")

    class DeadEnd:  # a backend whose state admits no token at all (no EOS either)
        def __init__(self, inner):
            self.inner = inner

        def mask(self):
            return self.inner.mask() & False

        def __getattr__(self, name):
            return getattr(self.inner, name)

    constraint = DeadEnd(engine.constraint(ss.Regex("a+")))
    decode = engine.speculator.row(engine.prompt_ids("go"), constraint, engine.config)
    with pytest.raises(ss.ConstraintError, match="no token"):
        run_alone(decode)


@pytest.mark.parametrize("pattern", ["a\x00b", r"a\x00b", r"a\0", r"a\x{0}", r"a\u0000"])
def test_a_nul_in_a_regex_is_a_constraint_error(pattern):
    with pytest.raises(ss.ConstraintError, match="NUL"):
        _compile(ConstraintSpec("regex", pattern))


def test_the_disk_cache_is_keyed_by_the_outlines_core_version(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECSTRUCT_CACHE", str(tmp_path))
    settings.cache_clear()
    table = compiler.token_table(tiny_tokenizer())
    first = compiler.index_path("x[0-9]+", table)
    monkeypatch.setattr(compiler, "OUTLINES_CORE_VERSION", "0.0.0-other")
    assert compiler.index_path("x[0-9]+", table) != first


def test_the_disk_cache_holds_the_index_binary(monkeypatch, tmp_path):  # outlines_core's own format, never a pickle
    from outlines_core import Index

    from specstruct.constraints.cache import unseal

    monkeypatch.setenv("SPECSTRUCT_CACHE", str(tmp_path))
    settings.cache_clear()
    table = compiler.token_table(tiny_tokenizer())
    spec = ConstraintSpec("regex", "y[a-c]{2}")
    built, _ = compiler._index("y[a-c]{2}", table, spec)
    stored = Index.from_binary(unseal("outlines-index", compiler.index_path("y[a-c]{2}", table).read_bytes()))
    assert stored.get_final_states() == built.get_final_states()
    assert compiler._index("y[a-c]{2}", table, spec)[0].get_initial_state() == built.get_initial_state()


def test_prepare_builds_the_tables_the_first_compile_would(monkeypatch):
    """`from_pretrained` prepares the tokenizer's shared tables while the draft loads: a compile after it builds no
    llguidance tokenizer of its own."""
    import llguidance.hf

    from specstruct.constraints.llguidance import grammar

    monkeypatch.setattr(grammar, "_LLTOKENIZERS", {})  # as in a fresh process
    tok = tiny_tokenizer()
    compiler.prepare(tok, len(tok) + 8)

    def rebuilt(*args, **kwargs):
        raise AssertionError("the compile rebuilt llguidance's tokenizer")

    monkeypatch.setattr(llguidance.hf, "from_tokenizer", rebuilt)
    constraint = _compile(ConstraintSpec("json", '{"type": "integer"}'))
    assert constraint.mask().any()
