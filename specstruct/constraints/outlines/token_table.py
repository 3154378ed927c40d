"""The tokenizer as the constraint engine sees it: every token id's real byte sequence.

Byte-level BPE tokenizers (GPT-2, Qwen) store tokens in a printable alphabet where each character
stands for one byte (`Ġ` is a space, `Ċ` a newline); a token may hold half of a UTF-8 character.
outlines 1.x turns tokens into *strings* with `convert_tokens_to_string`, which maps such half
characters to U+FFFD; we keep the exact bytes instead, so an automaton over bytes sees what the
model really writes. SentencePiece vocabularies (`▁` for space, `<0x0A>` byte tokens) are handled too.

Special tokens (chat markers, padding) are never legal output; EOS is added by the constraint at
final states; ids >= len(tokenizer) (padding rows of the LM head) do not exist here at all.
"""

from __future__ import annotations

import hashlib
import json
import re
import weakref
from dataclasses import dataclass, field

import numpy as np

from specstruct.constraints.cache import cache_dir, read_entry, seal, write_atomic

TERMINATOR, TERMINATOR_ID = b"\x00", 2**31 - 1  # an id no real vocabulary reaches
_FORMAT = "3"  # 3: GGUF padding pieces are special
_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
# GGUF vocabularies (llama.cpp's converter) fill the LM head's padding rows with "[PAD<id>]" pieces: not text
_GGUF_PAD = re.compile(r"^\[PAD(\d+)\]$")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


_UNICODE_TO_BYTE = {c: b for b, c in _bytes_to_unicode().items()}


@dataclass
class TokenTable:
    key: str                          # content hash: names the disk cache folder
    n_real: int                       # len(tokenizer): ids at or above it are LM-head padding
    eos_id: int
    token_bytes: list[bytes | None]   # None for special tokens
    special: frozenset[int]
    eos_like: np.ndarray = field(repr=False)     # special ids, excluded from automaton masks
    first_byte: np.ndarray = field(repr=False)   # [n_real] int16, -1 where the token is special/empty
    byte_token: dict[int, int] = field(repr=False)  # byte value -> id of its single-byte token
    _vocab: object = field(default=None, repr=False)

    def vocabulary(self):
        """The outlines_core Vocabulary (real byte strings -> ids), built once.

        Tokens holding a NUL byte are left out (no constrained output contains NUL) and the reserved id
        TERMINATOR_ID spells b"\0": constraints append NUL to their regex and ask "could the terminator
        follow here?" to decide finality (see constraints.py for the outlines_core bug this avoids)."""
        if self._vocab is None:
            from outlines_core import Vocabulary

            by_bytes: dict[bytes, list[int]] = {TERMINATOR: [TERMINATOR_ID]}
            for i, b in enumerate(self.token_bytes):
                if b and TERMINATOR not in b:
                    by_bytes.setdefault(b, []).append(i)
            self._vocab = Vocabulary(self.eos_id, by_bytes)
        return self._vocab


_MEMO: "weakref.WeakKeyDictionary[object, TokenTable]" = weakref.WeakKeyDictionary()


def token_table(tokenizer) -> TokenTable:
    """The TokenTable of an HF tokenizer (memoised per tokenizer object, cached on disk by content)."""
    try:
        return _MEMO[tokenizer]
    except (KeyError, TypeError):
        pass
    key = fingerprint(tokenizer)
    path = cache_dir() / key / "table.bin"
    hit = read_entry(path, "token-table", lambda payload: _decode(payload, key))  # a bad entry is rebuilt
    table = hit[0] if hit is not None else None
    if table is None:
        table = build_table(tokenizer, key)
        write_atomic(path, seal("token-table", _encode(table)))
    try:
        _MEMO[tokenizer] = table
    except TypeError:
        pass
    return table


def _encode(table: TokenTable) -> bytes:
    """The table as JSON (sizes, ids) + its token bytes end to end: data only, read back by `_decode`."""
    lengths = [-1 if b is None else len(b) for b in table.token_bytes]
    meta = json.dumps({"key": table.key, "n_real": table.n_real, "eos_id": table.eos_id,
                       "special": sorted(table.special), "lengths": lengths}).encode()
    return meta + b"\n" + b"".join(b for b in table.token_bytes if b)


def _decode(payload: bytes, key: str) -> TokenTable:
    meta_text, _, blob = payload.partition(b"\n")
    meta = json.loads(meta_text)
    if meta["key"] != key or len(meta["lengths"]) != meta["n_real"]:
        raise ValueError("a table of another tokenizer")
    token_bytes, at = [], 0
    for n in meta["lengths"]:
        token_bytes.append(None if n < 0 else bytes(blob[at:at + n]))
        at += max(n, 0)
    if at != len(blob):
        raise ValueError("token bytes do not add up")
    return _assemble(key, meta["n_real"], int(meta["eos_id"]), token_bytes, {int(i) for i in meta["special"]})


def fingerprint(tokenizer) -> str:
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    specials = sorted(_special_ids(tokenizer))
    blob = json.dumps([_FORMAT, type(tokenizer).__name__, vocab, specials, tokenizer.eos_token_id, len(tokenizer)])
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _special_ids(tokenizer) -> set[int]:
    ids = {i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if t.special}
    ids |= set(getattr(tokenizer, "all_special_ids", []) or [])
    return {i for i in ids if i is not None}


def _is_byte_level(tokenizer) -> bool:
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    try:
        return decoder is not None and b'"ByteLevel"' in decoder.__getstate__()
    except Exception:
        return type(decoder).__name__ == "ByteLevel"


def build_table(tokenizer, key: str = "") -> TokenTable:
    n_real = len(tokenizer)
    added = {i: t.content for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
    byte_level = _is_byte_level(tokenizer)
    by_id = {i: piece for piece, i in tokenizer.get_vocab().items()}
    pieces = [by_id.get(i) for i in range(n_real)]
    padding = {i for i, p in enumerate(pieces) if p and (m := _GGUF_PAD.match(p)) and int(m.group(1)) == i}
    special = _special_ids(tokenizer) | padding  # never legal in any constraint, free text included
    token_bytes: list[bytes | None] = []
    for i, piece in enumerate(pieces):
        if i in special or piece is None:
            token_bytes.append(None)
        elif i in added:
            token_bytes.append(added[i].encode("utf-8"))
        elif byte_level and all(c in _UNICODE_TO_BYTE for c in piece):
            token_bytes.append(bytes(_UNICODE_TO_BYTE[c] for c in piece))
        elif (m := _BYTE_TOKEN.match(piece)) is not None:
            token_bytes.append(bytes([int(m.group(1), 16)]))
        else:
            token_bytes.append(piece.replace("\u2581", " ").encode("utf-8"))
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no eos_token_id; set tokenizer.eos_token before compiling constraints")
    return _assemble(key or fingerprint(tokenizer), n_real, int(eos), token_bytes, special)


def _assemble(key: str, n_real: int, eos: int, token_bytes: list[bytes | None], special: set[int]) -> TokenTable:
    """The table from its stored parts (the rest is derived)."""
    first = np.full(n_real, -1, dtype=np.int16)
    byte_token: dict[int, int] = {}
    for i, b in enumerate(token_bytes):
        if b:
            first[i] = b[0]
            if len(b) == 1:
                byte_token.setdefault(b[0], i)
    return TokenTable(key=key, n_real=n_real, eos_id=int(eos), token_bytes=token_bytes,
                      special=frozenset(special | {int(eos)}), eos_like=np.array(sorted(special | {int(eos)})),
                      first_byte=first, byte_token=byte_token)

