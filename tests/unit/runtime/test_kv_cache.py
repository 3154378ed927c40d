"""The prefix cache and spill store on synthetic KV (each position's values encode its token and position):
matches of every kind, byte budgets, LRU and locks, the disk tier, lost spill files, salts, threads."""

import threading
import warnings

import pytest
import torch

from specstruct.runtime.kv import KVLostWarning, KVStore, PrefixCache, SeqKV
from specstruct.runtime.kv.layers import nbytes
from specstruct.runtime.kv.tiers import DiskTier, MemoryTier

LAYERS, HEADS, DIM = 2, 2, 4
PER_TOKEN = 2 * LAYERS * HEADS * DIM * 4


def kv(ids):
    """Deterministic KV for a token sequence (a position's value depends on its token and position)."""
    n = len(ids)
    base = torch.tensor([float(t * 1000 + i) for i, t in enumerate(ids)]).view(1, 1, n, 1)
    return [(base.expand(1, HEADS, n, DIM) + 0.25 * layer, base.expand(1, HEADS, n, DIM) - 0.5 * layer)
            for layer in range(LAYERS)]


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) and torch.equal(p, q) for (x, p), (y, q) in zip(a, b))


def found(c, ids, ns="ns"):
    """How many tokens of `ids` a lookup finds (the hit released at once)."""
    hit = c.lookup(ns, ids)
    hit.release()
    return hit.tokens


def cache(ram=1 << 20, disk=0, tmp=None):
    tiers = [MemoryTier(ram)] + ([DiskTier(disk, tmp)] if disk else [])
    return PrefixCache(tiers)


@pytest.mark.parametrize("query,expect", [
    ([1, 2, 3, 4, 5, 6], 6),        # exact
    ([1, 2, 3, 4], 4),              # shorter than the entry
    ([1, 2, 3, 4, 5, 6, 7, 8], 6),  # longer than the entry
    ([1, 2, 3, 9, 9], 3),           # diverges inside it
    ([9, 1, 2], 0),                 # miss
])
def test_lookup_returns_the_kv_of_the_longest_cached_prefix(query, expect):
    c = cache()
    c.insert("ns", [1, 2, 3, 4, 5, 6], kv([1, 2, 3, 4, 5, 6]))
    hit = c.lookup("ns", query)
    assert hit.tokens == expect
    if expect:
        assert same(hit.layers, kv(query[:expect]))
    hit.release()


def test_alignment_uses_whole_chunks_only():
    c = cache()
    c.insert("ns", list(range(1, 41)), kv(list(range(1, 41))))
    hit = c.lookup("ns", list(range(1, 38)), align=16)
    assert hit.tokens == 32 and same(hit.layers, kv(list(range(1, 33))))


def test_shared_prefix_is_stored_once_and_namespaces_are_separate():
    c = cache()
    c.insert("a", [1, 2, 3, 4, 5], kv([1, 2, 3, 4, 5]))
    c.insert("a", [1, 2, 3, 7, 8], kv([1, 2, 3, 7, 8]))
    assert c.info()["bytes"]["ram"] == 7 * PER_TOKEN  # 3 shared + 2 + 2
    assert found(c, [1, 2, 3], "b") == 0  # another model / numerics / salt
    hit = c.lookup("a", [1, 2, 3, 7, 8])
    assert hit.tokens == 5 and same(hit.layers, kv([1, 2, 3, 7, 8]))
    hit.release()


def test_returned_and_inserted_tensors_share_no_storage():
    c = cache()
    src = kv([1, 2, 3, 4])
    c.insert("ns", [1, 2, 3, 4], src)
    src[0][0].fill_(-1)  # the caller writes into its own tensors afterwards: the cache is unaffected
    hit = c.lookup("ns", [1, 2, 3, 4])
    hit.layers[0][0].fill_(-2)  # and writes into what it got back: still unaffected
    hit.release()
    again = c.lookup("ns", [1, 2, 3, 4])
    assert same(again.layers, kv([1, 2, 3, 4]))


def test_lru_eviction_under_a_tiny_budget_and_locks_protect_what_is_in_use():
    c = cache(ram=10 * PER_TOKEN)
    c.insert("ns", [1, 2, 3, 4, 5, 6], kv([1, 2, 3, 4, 5, 6]))
    held = c.lookup("ns", [1, 2, 3, 4, 5, 6])  # a running request holds this one
    c.insert("ns", [7, 8, 9, 10, 11, 12], kv([7, 8, 9, 10, 11, 12]))  # over budget: only the new one is free
    assert found(c, [7, 8, 9], "ns") == 0
    assert found(c, [1, 2, 3, 4, 5, 6], "ns") == 6
    held.release()
    c.insert("ns", [7, 8, 9, 10, 11, 12], kv([7, 8, 9, 10, 11, 12]))  # now [1..6] is least recently used
    info = c.info()
    assert info["bytes"]["ram"] <= 10 * PER_TOKEN and info["evictions"] == 2
    assert found(c, [1, 2, 3], "ns") == 0 and found(c, [7, 8, 9], "ns") == 3


def test_too_small_for_anything_still_answers_correctly():
    c = cache(ram=PER_TOKEN)
    c.insert("ns", [1, 2, 3], kv([1, 2, 3]))
    assert found(c, [1, 2, 3], "ns") == 0 and c.info()["bytes"]["ram"] == 0


def test_spill_to_disk_then_read_back(tmp_path):
    c = cache(ram=4 * PER_TOKEN, disk=100 * PER_TOKEN, tmp=tmp_path)
    c.insert("ns", [1, 2, 3, 4], kv([1, 2, 3, 4]))
    c.insert("ns", [5, 6, 7, 8], kv([5, 6, 7, 8]))  # pushes [1..4] down to disk
    assert c.info()["spills"] == 1 and len(list(tmp_path.rglob("*.safetensors"))) == 1
    hit = c.lookup("ns", [1, 2, 3, 4, 9])
    assert hit.tokens == 4 and same(hit.layers, kv([1, 2, 3, 4])) and c.info()["restores"] == 1
    hit.release()


@pytest.mark.parametrize("damage", ["delete", "corrupt", "truncate"])
def test_missing_or_corrupted_spill_file_reads_as_a_miss_with_a_warning(tmp_path, damage):
    c = cache(ram=4 * PER_TOKEN, disk=100 * PER_TOKEN, tmp=tmp_path)
    c.insert("ns", [1, 2, 3, 4], kv([1, 2, 3, 4]))
    c.insert("ns", [5, 6, 7, 8], kv([5, 6, 7, 8]))
    (f,) = tmp_path.rglob("*.safetensors")
    data = f.read_bytes()
    if damage == "delete":
        f.unlink()
    elif damage == "corrupt":
        f.write_bytes(data[:-8] + bytes(8))
    else:
        f.write_bytes(data[: len(data) // 2])
    with pytest.warns(KVLostWarning):
        hit = c.lookup("ns", [1, 2, 3, 4])
    assert hit.tokens == 0 and c.info()["lost"] == 1
    c.insert("ns", [1, 2, 3, 4], kv([1, 2, 3, 4]))  # the re-prefilled KV is stored again
    hit = c.lookup("ns", [1, 2, 3, 4])
    assert hit.tokens == 4 and same(hit.layers, kv([1, 2, 3, 4]))


def test_prefetch_brings_spilled_spans_back_in_the_background(tmp_path):
    c = cache(ram=4 * PER_TOKEN, disk=100 * PER_TOKEN, tmp=tmp_path)
    c.insert("ns", [1, 2, 3, 4], kv([1, 2, 3, 4]))
    c.insert("ns", [5, 6, 7, 8], kv([5, 6, 7, 8]))
    assert c.prefetch("ns", [1, 2, 3, 4, 5]).result(timeout=30) == 1
    assert c.info()["restores"] == 1
    hit = c.lookup("ns", [1, 2, 3, 4])
    assert same(hit.layers, kv([1, 2, 3, 4]))


def test_threads_sharing_one_prefix():
    c = cache(ram=60 * PER_TOKEN)
    shared = list(range(100, 120))
    errors = []

    def worker(w):
        try:
            for i in range(20):
                ids = shared + [w, i, w + i]
                hit = c.lookup("ns", ids[:-1])
                if hit.tokens:
                    assert same(hit.layers, kv(ids[: hit.tokens]))
                hit.release()
                c.insert("ns", ids, kv(ids))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    info = c.info()
    assert info["bytes"]["ram"] <= 60 * PER_TOKEN and info["hits"] > 0


def test_store_spill_restore_and_lost_file(tmp_path):
    store = KVStore([DiskTier(1 << 20, tmp_path)])
    seq = SeqKV([1, 2, 3], kv([1, 2, 3]))
    h = store.spill(seq)
    assert h.tier == 0 and store.info()["bytes"]["disk"] == nbytes(seq.layers)
    store.prefetch(h)
    back = store.restore(h)
    assert back.tokens == [1, 2, 3] and same(back.layers, kv([1, 2, 3]))
    assert store.info()["bytes"]["disk"] == 0 and not list(tmp_path.rglob("*.safetensors"))
    h = store.spill(seq)
    next(tmp_path.rglob("*.safetensors")).unlink()
    with pytest.warns(KVLostWarning):
        back = store.restore(h)
    assert back.layers is None and back.tokens == [1, 2, 3]
    tiny = KVStore([DiskTier(8, tmp_path)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tiny.restore(tiny.spill(seq)).layers is None  # never fitted: tokens only, no warning


def test_store_keeps_the_token_ids_when_a_spill_cannot_be_written(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    store = KVStore([DiskTier(1 << 20, blocker)])  # its spill folder cannot be made: every write fails
    with pytest.warns(KVLostWarning, match="could not be spilled"):
        h = store.spill(SeqKV([1, 2, 3], kv([1, 2, 3])))
    assert h.slot is None and store.info()["tokens_only"] == 1
    assert store.restore(h).layers is None
