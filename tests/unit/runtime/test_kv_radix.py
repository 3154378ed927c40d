"""The radix tree under the prefix cache: matching, splitting, lock counts, removal."""

from specstruct.runtime.kv.radix import RadixTree


def _insert(tree, ids):
    return tree.insert(ids, lambda p, at: ((p[0], p[0] + at), (p[0] + at, p[1])), lambda s, e: (s, e))


def test_match_exact_shorter_longer_and_divergent():
    t = RadixTree()
    _insert(t, [1, 2, 3, 4, 5])
    assert [k for _, k in t.match([1, 2, 3, 4, 5])] == [5]
    assert [k for _, k in t.match([1, 2, 3])] == [3]  # the query is shorter: partial node
    assert [k for _, k in t.match([1, 2, 3, 4, 5, 6, 7])] == [5]  # longer query: the whole entry
    assert [k for _, k in t.match([1, 2, 9])] == [2]  # diverges inside the node
    assert t.match([7]) == []


def test_insert_splits_and_shares_the_common_prefix():
    t = RadixTree()
    _insert(t, [1, 2, 3, 4])
    nodes = _insert(t, [1, 2, 8, 9])
    assert [n.tokens for n in nodes] == [(1, 2), (8, 9)]
    assert [n.payload for n in nodes] == [(0, 2), (2, 4)]  # the split parent's payload covers its own span
    assert sorted(n.tokens for n in t.nodes()) == [(1, 2), (3, 4), (8, 9)]
    assert [k for _, k in t.match([1, 2, 3, 4])] == [2, 2]


def test_locks_count_on_ancestors_and_survive_a_split():
    t = RadixTree()
    leaf = _insert(t, [1, 2, 3, 4])[-1]
    t.lock(leaf)
    _insert(t, [1, 2, 7])  # splits the locked node: the new parent inherits the lock
    head = leaf.parent
    assert head.tokens == (1, 2) and head.locks == 1 and leaf.locks == 1
    t.lock(leaf, -1)
    assert head.locks == 0 and leaf.locks == 0


def test_remove_takes_the_subtree():
    t = RadixTree()
    _insert(t, [1, 2, 3])
    _insert(t, [1, 2, 4])
    head = t.match([1, 2])[0][0]
    removed = t.remove(head)
    assert len(removed) == 3 and list(t.nodes()) == []
