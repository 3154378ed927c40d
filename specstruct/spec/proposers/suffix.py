"""A suffix index over a tenant's own earlier requests: where the tokens written last also occurred in an earlier prompt
or output of the same tenant, propose what followed them there (SuffixDecoding, Oliaro et al. 2024, with a hash-chain
index instead of a suffix tree).

Agent loops and repeated extractions write the same things request after request: the tool-call envelope, the same
keys and argument names, sentences of the same system prompt echoed back. Prompt lookup (lookup.py) copies only from
the current request; this proposer remembers the finished ones (`remember`, prompt and output as token ids).

Tenants: each `cache_salt` (None is the tenant of every unsalted request, as in the prefix cache) has an index of its
own; a request reads only its own tenant's index, so nothing one tenant wrote is ever proposed to another. A request
with the proposer switched off (or speculation off) neither reads nor adds to it; a seeded sampled request does
not read it (its candidates would depend on earlier requests, and so would its sample: a seed reproduces its output).

Bounded memory: a tenant keeps at most TENANT_TOKENS tokens (its oldest requests are dropped first) and the index
at most TOTAL_TOKENS over all tenants (the tenant used longest ago is dropped first). Per stored token it costs two
array slots and at most one dict entry.

Matching: the last KEY tokens of the context select a chain of earlier positions with the same KEY tokens (most
recent first, at most CHAIN of them); the one whose match reaches furthest back (up to MAX_MATCH tokens) wins, ties
to the most recent. The tokens after it, up to the end of that request, are the candidates. The target verifies
them like any other, so the output cannot change.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from typing import Hashable, Sequence

from specstruct.constraints.base import Constraint
from specstruct.spec.interfaces import Draft, Setup, Sizing, Traits

KEY = 3  # tokens a match needs at least (the chain key)
MAX_MATCH = 32  # tokens a match is extended backwards to rank the chain's positions
CHAIN = 16  # earlier occurrences of the key tried per proposal
TENANT_TOKENS = 1 << 15  # tokens one tenant's index keeps (its oldest requests dropped first)
TOTAL_TOKENS = 1 << 18  # tokens all tenants' indexes keep together (the tenant used longest ago dropped first)
END = -1  # between two requests in a tenant's token store: a match never crosses it, a copy stops at it


class TenantIndex:
    """One tenant's requests as one token store with a hash-chain index of every KEY-token window."""

    def __init__(self, limit: int = TENANT_TOKENS):
        self.limit = limit
        self.docs: list[list[int]] = []
        self.tokens = array("q")
        self.prev = array("q")  # per position: the previous position ending the same key (-1: none)
        self.head: dict[tuple[int, ...], int] = {}  # key -> the last position ending it

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, ids: Sequence[int]) -> None:
        """Remember one request's tokens; drop the oldest requests when over the limit."""
        doc = list(ids[-self.limit :])
        if len(doc) < KEY + 1:
            return
        self.docs.append(doc)
        if len(self.tokens) + len(doc) + 1 > self.limit:
            keep: list[list[int]] = []
            size = 0
            for d in reversed(self.docs):  # the newest requests that fit in three quarters of the limit
                if keep and size + len(d) + 1 > self.limit * 3 // 4:
                    break
                keep.append(d)
                size += len(d) + 1
            self.docs = keep[::-1]
            self.tokens, self.prev, self.head = array("q"), array("q"), {}
            for d in self.docs:
                self._append(d)
        else:
            self._append(doc)

    def _append(self, doc: list[int]) -> None:
        start = len(self.tokens)
        self.tokens.extend(doc)
        self.tokens.append(END)
        self.prev.extend([-1] * (len(doc) + 1))
        for i in range(start + KEY - 1, start + len(doc)):
            key = tuple(self.tokens[i - KEY + 1 : i + 1])
            self.prev[i] = self.head.get(key, -1)
            self.head[key] = i

    def follow(self, context: Sequence[int], k: int) -> list[int]:
        """Up to k tokens that followed the best earlier match of the end of `context` (none: [])."""
        if k <= 0 or len(context) < KEY:
            return []
        pos = self.head.get(tuple(context[-KEY:]), -1)
        best, best_len, tried = -1, 0, 0
        limit = min(MAX_MATCH, len(context))
        while pos >= 0 and tried < CHAIN:
            tried += 1
            n = KEY
            while n < limit and pos - n >= 0 and self.tokens[pos - n] == context[-n - 1]:
                n += 1
            if n > best_len and self.tokens[pos + 1] != END:
                best, best_len = pos, n
                if n == limit:
                    break
            pos = self.prev[pos]
        if best < 0:
            return []
        out: list[int] = []
        for t in self.tokens[best + 1 : best + 1 + k]:
            if t == END:
                break
            out.append(int(t))
        return out


class SuffixIndex:
    """Every tenant's TenantIndex, least recently used first, within TOTAL_TOKENS."""

    def __init__(self, tenant_tokens: int = TENANT_TOKENS, total_tokens: int = TOTAL_TOKENS):
        self.tenant_tokens, self.total_tokens = tenant_tokens, total_tokens
        self.tenants: OrderedDict[Hashable, TenantIndex] = OrderedDict()

    def tokens(self) -> int:
        return sum(len(t) for t in self.tenants.values())

    def add(self, tenant: Hashable, ids: Sequence[int]) -> None:
        index = self.tenants.get(tenant)
        if index is None:
            index = self.tenants[tenant] = TenantIndex(self.tenant_tokens)
        self.tenants.move_to_end(tenant)
        index.add(ids)
        total = self.tokens()
        while total > self.total_tokens and len(self.tenants) > 1:
            _, dropped = self.tenants.popitem(last=False)
            total -= len(dropped)

    def follow(self, tenant: Hashable, context: Sequence[int], k: int) -> list[int]:
        index = self.tenants.get(tenant)
        if index is None:
            return []
        self.tenants.move_to_end(tenant)
        return index.follow(context, k)


class SuffixIndexDrafter:
    """The proposer: copies from the tenant's earlier requests (a guess, then a copy, as prompt lookup)."""

    traits = Traits("suffix", switch="use_suffix_index", sizing=Sizing.COPY, per_tenant=True)
    name = traits.name

    @classmethod
    def create(cls, setup: Setup) -> "SuffixIndexDrafter":
        return cls()

    def __init__(self, index: SuffixIndex | None = None):
        self.index = index or SuffixIndex()

    def propose(self, context: Sequence[int], constraint: Constraint, k: int, temperature: float,
                text: str | None = None, room: int | None = None, tenant: Hashable = None) -> Draft:
        ids = self.index.follow(tenant, context, k)
        return Draft.legal(ids, constraint, self.name) if ids else Draft([], source=self.name)

    def remember(self, tenant: Hashable, ids: Sequence[int]) -> None:
        """A finished request of `tenant`: its prompt and output, as token ids."""
        self.index.add(tenant, ids)

    def __repr__(self) -> str:
        return f"SuffixIndexDrafter({len(self.index.tenants)} tenants, {self.index.tokens()} tokens)"

