"""A radix tree over token ids, the shape of SGLang's RadixAttention: each node holds one span of tokens and an
opaque payload for that span. A lock taken on a node counts on it and on every ancestor (what a running request
uses is never moved or dropped); `last_used` gives the LRU order. Not thread-safe: the owner holds a lock."""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterator, Sequence


class Node:
    __slots__ = ("tokens", "children", "parent", "payload", "locks", "last_used")

    def __init__(self, tokens: tuple[int, ...], parent: "Node | None", payload: Any = None):
        self.tokens = tokens
        self.children: dict[int, Node] = {}
        self.parent = parent
        self.payload = payload
        self.locks = 0
        self.last_used = 0

    @property
    def depth(self) -> int:
        d, n = 0, self.parent
        while n is not None:
            d, n = d + 1, n.parent
        return d


def _common(a: Sequence[int], b: Sequence[int], offset: int) -> int:
    n = min(len(a), len(b) - offset)
    i = 0
    while i < n and a[i] == b[offset + i]:
        i += 1
    return i


class RadixTree:
    def __init__(self) -> None:
        self.root = Node((), None)
        self._clock = itertools.count(1)

    def match(self, ids: Sequence[int], usable: Callable[[Node], bool] = lambda n: True) -> list[tuple[Node, int]]:
        """The nodes along the longest cached prefix of `ids`, each with how many of its tokens matched (only the
        last may be partial). The walk stops before a node that `usable` rejects."""
        path: list[tuple[Node, int]] = []
        node, i = self.root, 0
        while i < len(ids):
            child = node.children.get(ids[i])
            if child is None or not usable(child):
                break
            n = _common(child.tokens, ids, i)
            path.append((child, n))
            i += n
            if n < len(child.tokens):
                break
            node = child
        return path

    def touch(self, nodes: Sequence[Node]) -> None:
        t = next(self._clock)
        for n in nodes:
            n.last_used = t

    def lock(self, node: Node | None, delta: int = 1) -> None:
        while node is not None and node is not self.root:
            node.locks += delta
            if node.locks < 0:
                raise RuntimeError("internal error: prefix cache lock released twice")
            node = node.parent

    def split(self, node: Node, at: int, split_payload: Callable[[Any, int], tuple[Any, Any]]) -> Node:
        """Cut `node` after `at` tokens: a new parent holds tokens[:at], `node` keeps the rest. Returns the parent."""
        head_payload, tail_payload = split_payload(node.payload, at)
        parent = node.parent
        assert parent is not None, "internal error: splitting the root"
        head = Node(node.tokens[:at], parent, head_payload)
        head.locks, head.last_used = node.locks, node.last_used
        parent.children[head.tokens[0]] = head
        node.tokens, node.payload, node.parent = node.tokens[at:], tail_payload, head
        head.children[node.tokens[0]] = node
        return head

    def insert(self, ids: Sequence[int], split_payload: Callable[[Any, int], tuple[Any, Any]],
               new_payload: Callable[[int, int], Any]) -> list[Node]:
        """Make `ids` a path in the tree; `new_payload(start, end)` fills a new node for ids[start:end].
        Returns the path's nodes, root excluded."""
        path = self.match(ids)
        nodes = [n for n, _ in path]
        covered = sum(k for _, k in path)
        if path and path[-1][1] < len(path[-1][0].tokens):
            nodes[-1] = self.split(path[-1][0], path[-1][1], split_payload)
        if covered < len(ids):
            parent = nodes[-1] if nodes else self.root
            leaf = Node(tuple(ids[covered:]), parent, new_payload(covered, len(ids)))
            parent.children[leaf.tokens[0]] = leaf
            nodes.append(leaf)
        self.touch(nodes)
        return nodes

    def remove(self, node: Node) -> list[Node]:
        """Detach `node` and its subtree; returns the removed nodes (their payloads are the caller's to free)."""
        if node.locks:
            raise RuntimeError("internal error: removing a locked prefix cache node")
        assert node.parent is not None, "internal error: removing the root"
        del node.parent.children[node.tokens[0]]
        return list(self._walk(node))

    def nodes(self) -> Iterator[Node]:
        for child in list(self.root.children.values()):
            yield from self._walk(child)

    def _walk(self, node: Node) -> Iterator[Node]:
        stack = [node]
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())
