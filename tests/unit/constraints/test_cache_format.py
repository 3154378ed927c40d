"""The on-disk constraint cache is data, never code: a planted pickle does not run and is replaced, a corrupt or
foreign entry is discarded (logged once) and rebuilt, and the request that found it still compiles."""

from __future__ import annotations

import logging
import os
import pickle

import pytest

from specstruct import settings
from specstruct.constraints import compiler
from specstruct.constraints.outlines import token_table as tt
from specstruct.constraints.base import ConstraintSpec
from specstruct.constraints.cache import _WARNED, seal, unseal
from specstruct.testing import tiny_tokenizer

REGEX = "z[0-9]{2}"


class _Planted:
    """A pickle that would create a file when loaded."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty cache folder, and no in-memory copies: every compile reads the disk."""
    monkeypatch.setenv("SPECSTRUCT_CACHE", str(tmp_path / "cache"))
    settings.cache_clear()
    monkeypatch.setattr(compiler, "_PROGRAMS", compiler.ByteLRU(lambda: 1 << 30))
    monkeypatch.setattr(tt, "_MEMO", tt.weakref.WeakKeyDictionary())
    _WARNED.clear()
    return tmp_path


def _compile(tok):
    tt._MEMO.pop(tok, None)
    compiler._PROGRAMS.clear()
    c = compiler.compile_constraint(ConstraintSpec("regex", REGEX), tok, vocab_size=len(tok) + 8,
                                    eos_token_ids=[tok.eos_token_id])
    assert c.accepts("z42") and not c.accepts("z4x")
    return c


def _paths(tok):
    table = tt.token_table(tok)
    return compiler.index_path(REGEX, table), compiler.cache_dir() / table.key / "table.bin"


def test_a_planted_pickle_never_runs_and_is_rebuilt(fresh, caplog):
    tok = tiny_tokenizer()
    _compile(tok)
    index, table = _paths(tok)
    for path, name in ((index, "index-ran"), (table, "table-ran")):
        path.write_bytes(pickle.dumps(_Planted(fresh / name)))
    with caplog.at_level(logging.WARNING, logger="specstruct.cache"):
        _compile(tok)
    assert not (fresh / "index-ran").exists() and not (fresh / "table-ran").exists()
    assert unseal("outlines-index", index.read_bytes()) and unseal("token-table", table.read_bytes())  # rebuilt
    assert "discarded" in caplog.text


@pytest.mark.parametrize("damage", [
    lambda data: data[: len(data) // 2],                    # truncated
    lambda data: data[:-1] + bytes([data[-1] ^ 1]),          # one bit flipped: checksum
    lambda data: seal("token-table", b"not an index"),       # another kind's entry
    lambda data: seal("outlines-index", b"\x00\x01garbage"),  # a sealed entry that does not decode
    lambda data: pickle.dumps({"a valid pickle": "of the wrong type"}),
])
def test_a_bad_index_entry_is_rebuilt(fresh, damage):
    tok = tiny_tokenizer()
    _compile(tok)
    index, _ = _paths(tok)
    good = index.read_bytes()
    index.write_bytes(damage(good))
    _compile(tok)  # succeeds, every time, not only once
    assert unseal("outlines-index", index.read_bytes()) == unseal("outlines-index", good)
    _compile(tok)


def test_a_bad_table_entry_is_rebuilt(fresh):
    tok = tiny_tokenizer()
    _compile(tok)
    _, table = _paths(tok)
    good = table.read_bytes()
    table.write_bytes(good[:-10])
    _compile(tok)
    assert table.read_bytes() == good


def test_bad_entries_are_logged_once(fresh, caplog):
    tok = tiny_tokenizer()
    _compile(tok)
    index, _ = _paths(tok)
    with caplog.at_level(logging.WARNING, logger="specstruct.cache"):
        for _ in range(3):
            index.write_bytes(b"junk")
            _compile(tok)
    assert caplog.text.count("discarded the outlines-index cache entry") == 1


def test_the_table_round_trips(fresh):
    tok = tiny_tokenizer()
    built = tt.build_table(tok)
    back = tt._decode(tt._encode(built), built.key)
    assert back.token_bytes == built.token_bytes and back.special == built.special and back.eos_id == built.eos_id
    assert (back.first_byte == built.first_byte).all() and back.byte_token == built.byte_token
    assert list(back.eos_like) == list(built.eos_like)
