"""Chat messages -> prompt token ids in which only the chat template's own markers are control tokens.

Encoding a rendered template as one string would turn `<|im_start|>system` written inside a user message (or a tool
result, a tool's description, a schema's text) into the real control token: the user opens a system turn. Here
every string a caller passes is rendered with each added token's text (special or not: Qwen's `<tool_call>` too)
hidden behind a private placeholder; the markers then found in the rendered text are the template's, and become
their ids; the text between them gets the placeholders back and is encoded as plain text (special tokens split into
ordinary tokens). Tokenizers split at added tokens before anything else, so text without markers gets exactly the
ids that encoding the rendered template gives: ordinary prompts, the prefix cache and benchmarks see no change.

A RawPrompt is not passed here: its author writes the control tokens it wants (api.py encodes it as written).
"""

from __future__ import annotations

import functools
import re
from typing import Any, Callable

from specstruct.api.inputs import Message, Tool

_ANCHORS = range(0xE000, 0xF900)  # Unicode private use: not in ordinary text, kept as is by `tojson`


def chat_ids(tok: Any, messages: list[Message], tools: list[Tool] | None) -> list[int]:
    """The prompt ids of `messages` (and `tools`) through the tokenizer's chat template; without a template, the
    contents joined by blank lines, all plain text."""
    names = _added(tok)
    if not getattr(tok, "chat_template", None):
        return _plain(tok, "\n\n".join(str(m["content"]) for m in messages) + "\n\n", names)
    if not names:
        encoded: list[int] = tok.encode(_render(tok, messages, tools), add_special_tokens=False)
        return encoded
    anchor = _unused_anchor((messages, tools))
    hidden: list[str] = []
    hide = functools.partial(_hide, pattern=names.hide, anchor=anchor, table=hidden)
    text = _render(tok, _map_strings(messages, hide), _map_strings(tools, hide))
    restore = re.compile(f"{anchor}(\\d+){anchor}")
    ids: list[int] = []
    start = 0
    for marker in names.find.finditer(text):  # only the template's: every caller's string had its markers hidden
        ids += _plain(tok, restore.sub(lambda m: hidden[int(m.group(1))], text[start:marker.start()]), names)
        ids.append(tok.convert_tokens_to_ids(next(name for name in marker.groups() if name)))
        start = marker.end()
    return ids + _plain(tok, restore.sub(lambda m: hidden[int(m.group(1))], text[start:]), names)


def _render(tok: Any, messages: Any, tools: Any) -> str:
    text: str = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    return text


class _Names:
    """A tokenizer's added tokens (but those that are only whitespace: text, not markers) as patterns: `find` (any
    of them, with the spaces the tokenizer strips beside it), `hide` (any of them, or at a string's ends a piece of
    one that a neighbouring string could complete), `plain` (those that split_special_tokens leaves whole: added
    tokens not marked special)."""

    def __init__(self, tokens: tuple[tuple[str, bool, bool, bool], ...]):
        names = [name for name, *_ in tokens]
        alternatives = "|".join(map(re.escape, names))
        heads = {n[:k] for n in names for k in range(1, len(n))}  # a string ending so could start a marker
        tails = {n[k:] for n in names for k in range(1, len(n))}  # a string starting so could end one
        self.find = re.compile("|".join(f"{_SPACE if left else ''}({re.escape(name)}){_SPACE if right else ''}"
                                        for name, _, left, right in tokens))
        self.hide = re.compile(f"{alternatives}|^(?:{_pieces(tails)})|(?:{_pieces(heads)})\\Z")
        nonspecial = [name for name, special, *_ in tokens if not special]
        self.plain = re.compile("|".join(map(re.escape, nonspecial))) if nonspecial else None


_SPACE = r"\s*"


def _pieces(pieces: set[str]) -> str:
    """Pieces of markers as alternatives, longest first; pieces of letters and digits only are left alone (a role
    or a type name never hides), as a marker split between strings always has a bracket on one side at least."""
    kept = sorted((p for p in pieces if not p.isalnum()), key=len, reverse=True)
    return "|".join(map(re.escape, kept)) or "(?!)"


@functools.lru_cache(maxsize=8)
def _names(tokens: tuple[tuple[str, bool, bool, bool], ...]) -> _Names:
    return _Names(tokens)


def _added(tok: Any) -> _Names | None:
    decoder = getattr(tok, "added_tokens_decoder", None) or {}
    tokens = sorted({(t.content, bool(t.special), bool(getattr(t, "lstrip", False)), bool(getattr(t, "rstrip", False)))
                     for t in decoder.values() if t.content.strip()}, key=lambda t: (-len(t[0]), t))
    return _names(tuple(tokens)) if tokens else None


def _plain(tok: Any, text: str, names: _Names | None) -> list[int]:
    """`text` as ordinary tokens: special tokens' text is split (split_special_tokens), and each added token that
    is not special (the tokenizer matches those regardless) is broken after its first character."""
    if not text:
        return []
    pieces, start = [], 0
    if names is not None and names.plain is not None:
        for found in names.plain.finditer(text):
            pieces.append(text[start:found.start() + 1])
            start = found.start() + 1
    pieces.append(text[start:])
    return [i for piece in pieces if piece
            for i in tok.encode(piece, add_special_tokens=False, split_special_tokens=True)]


def _hide(text: str, *, pattern: re.Pattern[str], anchor: str, table: list[str]) -> str:
    def placeholder(found: re.Match[str]) -> str:
        table.append(found.group())
        return f"{anchor}{len(table) - 1}{anchor}"

    return pattern.sub(placeholder, text)


def _map_strings(value: object, fn: Callable[[str], object]) -> Any:
    """Every str inside dicts and lists (keys too: a schema's property names reach the template) mapped by fn."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {_map_strings(k, fn): _map_strings(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_map_strings(v, fn) for v in value]
    return value


def _unused_anchor(value: object) -> str:
    """A private-use character that no string of the call holds, so that placeholders cannot be forged."""
    seen: set[str] = set()
    _map_strings(value, lambda s: seen.update(c for c in s if "\ue000" <= c <= "\uf8ff"))
    return next(chr(c) for c in _ANCHORS if chr(c) not in seen)
