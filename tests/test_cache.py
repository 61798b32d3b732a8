"""The cache interface (storage/cache.py): admission and eviction by policy, per tier."""
import os
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from pcrfs.storage.cache import MemoryTier, Policy, StaticPolicy, make_policy, rank
from pcrfs.storage.diskcache import DiskCache
from testkit.pages import CLEAN_PAGES, drop_page_cache


def test_static_admits_exactly_the_hash_chosen_subset_and_never_evicts():
    keys = list(range(2000))
    tier = MemoryTier(10**9, StaticPolicy(0.3))
    for k in keys:
        tier.put(k, b"x" * 10)
    kept = {k for k in keys if tier.contains(k)}
    assert kept == {k for k in keys if rank(k) < 0.3}
    assert abs(len(kept) / len(keys) - 0.3) < 0.04
    s = tier.stats()
    assert s["policy"] == "static" and s["evicted"] == 0 and s["admitted"] == len(kept)


def test_static_full_tier_refuses_instead_of_evicting():
    tier = MemoryTier(100, StaticPolicy(1.0))
    assert tier.put("a", b"x" * 60) and not tier.put("b", b"y" * 60)
    assert tier.get("a") == b"x" * 60 and tier.get("b") is None
    assert tier.stats()["refused"] == 1 and tier.stats()["evicted"] == 0


@settings(max_examples=30, deadline=None)
@given(st.floats(0.05, 0.95), st.integers(0, 2**31))
def test_static_hit_ratio_is_the_capacity_fraction_in_any_order(fraction, seed):
    """Three shuffled epochs over 3000 equal images: epoch 1 fills, then every epoch hits
    exactly the admitted set, whatever the order."""
    n, size = 3000, 100
    tier = MemoryTier(int(fraction * n * size), make_policy("static", int(fraction * n * size),
                                                              n * size))
    rnd = random.Random(seed)
    ratios = []
    for _ in range(3):
        order = list(range(n))
        rnd.shuffle(order)
        hits = 0
        for i in order:
            if tier.get(i) is not None:
                hits += 1
            else:
                tier.put(i, b"z" * size)
        ratios.append(hits / n)
    admitted = tier.stats()["admitted"] / n
    chosen = sum(rank(i) < fraction for i in range(n)) / n
    assert ratios[0] == 0 and ratios[1] == ratios[2] == admitted    # the admitted set, exactly
    assert admitted <= chosen and abs(admitted - fraction) < 0.05 and tier.used <= tier.capacity


def test_lru_under_a_shuffled_epoch_hits_far_below_its_capacity():
    n = 3000
    tier = MemoryTier(int(0.3 * n), Policy())
    rnd = random.Random(0)
    for _ in range(3):
        order = list(range(n))
        rnd.shuffle(order)
        hits = sum(tier.get(i) is not None or not tier.put(i, b"z") for i in order)
    assert hits / n < 0.2          # measured about 0.1 here: the motivation for static


def test_disk_tier_static_keeps_its_subset_across_reopen(tmp_path):
    d = DiskCache(str(tmp_path / "c"), 1 << 20, StaticPolicy(0.5))
    for i in range(200):
        d.put(f"k{i}", b"v" * 100, akey=i)
    kept = {i for i in range(200) if d.contains(f"k{i}")}
    assert kept == {i for i in range(200) if rank(i) < 0.5}
    d2 = DiskCache(str(tmp_path / "c"), 1 << 20, StaticPolicy(0.5))   # a remount
    assert {i for i in range(200) if d2.get(f"k{i}") is not None} == kept
    assert d2.stats()["hits"] == len(kept) and d2.stats()["policy"] == "static"


def test_disk_tier_static_refuses_what_does_not_fit(tmp_path):
    d = DiskCache(str(tmp_path / "c"), 1000, StaticPolicy(1.0))
    for i in range(20):
        d.put(f"k{i}", b"v" * 100, akey=i)
    assert d.used <= 1000 and d.stats()["evicted"] == 0 and d.stats()["refused"] > 0


def test_static_memory_tier_through_the_kernel(corpus_ds, mount):
    """Three shuffled epochs of q3 with the kernel's page cache dropped before each: the
    memory tier serves exactly its admitted images in every epoch after the first, and
    they are the lowest-ranked images whose bytes fit its capacity."""
    import os

    from pcrfs.dataset import open_dataset
    local = open_dataset(str(corpus_ds))
    view = "q3"
    paths = [p for p, _ in local.index.iter_images()]
    budget = int(0.3 * local.manifest["summary"]["total_bytes"][view])
    m = mount(corpus_ds, "--cache-size", str(budget), "-o", "cache_policy=static,fast_lane=no")
    capacity = m.stats()["cache_tiers"]["memory"]["capacity"]
    assert 0 < capacity < budget     # the open-files share is carved out of the budget
    chosen, used = set(), 0
    for p in sorted(paths, key=lambda p: rank(local.lookup(p).ordinal)):
        size = local.file_size(p, view)
        if used + size > capacity:
            break
        chosen.add(p)
        used += size
    assert 0 < len(chosen) < len(paths)
    hits = []
    for epoch in range(3):
        drop_page_cache(CLEAN_PAGES)
        before = m.stats()["memory_image_hits"]
        order = list(paths)
        random.Random(epoch).shuffle(order)
        for p in order:
            with open(os.path.join(os.fsencode(m.mnt), view.encode(), p), "rb") as f:
                assert f.read() == local.read(p, view)
        hits.append(m.stats()["memory_image_hits"] - before)
    assert hits == [0, len(chosen), len(chosen)]
    mem = m.stats()["cache_tiers"]["memory"]
    assert mem["policy"] == "static" and mem["evicted"] == 0
    assert mem["admitted"] == len(chosen) and mem["bytes"] == used <= capacity


def test_static_at_a_2mib_budget_pins_one_set_in_the_lane(crops_ds, mount):
    """Static with the fast lane at a 2 MiB budget, 30-40% of a 240-image view: the lane's
    store is the one pinned set and takes 13/16 of the budget (the memory tier holds no
    second copy), so shuffled epochs after the first read that share fewer record bytes
    (the lane answers the pinned files' READs), the same files every epoch, and nothing is
    evicted.  Before, the lane's quarter-budget LRU and a memory tier of half the budget
    each held their own images and an epoch hit 0.148 at a 30% budget."""
    from pcrfs.dataset import open_dataset
    local = open_dataset(str(crops_ds))
    budget = 2 << 20
    totals = local.manifest["summary"]["total_bytes"]
    view = min(local.views, key=lambda v: abs(totals[v] * 0.3 - budget))
    share = budget / totals[view]
    assert 0.2 < share < 0.45, (view, share)
    paths = [p for p, _ in local.index.iter_images()]
    m = mount(crops_ds, "--cache-size", "2M", "-o", "cache_policy=static")
    record_bytes, kept = [], []
    for epoch in range(3):
        drop_page_cache(CLEAN_PAGES)
        before = m.stats()
        order = list(paths)
        random.Random(epoch).shuffle(order)
        for p in order:
            with open(os.path.join(os.fsencode(m.mnt), view.encode(), p), "rb") as f:
                assert f.read() == local.read(p, view)
        after = m.stats()
        record_bytes.append(after["backend_bytes"] - before["backend_bytes"])
        kept.append(after["fast_lane"]["store_kept"])
    lane = m.stats()["fast_lane"]
    hit = 1 - record_bytes[1] / record_bytes[0]
    assert hit >= 0.75 * share, (hit, share, record_bytes)   # 13/16 of the budget pins
    assert record_bytes[2] == record_bytes[1]                # the same set every epoch
    assert kept[0] == kept[2] > 0 and lane["store_evicted"] == 0, lane
    assert lane["store_bytes"] <= lane["store_budget"] < budget
    assert lane["store_budget"] >= 0.8 * budget
    mem = m.stats()["cache_tiers"]["memory"]
    assert mem["bytes"] == 0 and mem["admitted"] == 0        # no second copy


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 5000), min_size=1, max_size=400), st.floats(0.0, 1.2))
def test_static_universe_admits_the_lowest_ranks_that_fit(sizes, fraction):
    """With a Universe, a static tier admits exactly the rank-ordered prefix of keys whose
    bytes fit its capacity: it fills to within one entry of capacity and never over it."""
    import numpy as np

    from pcrfs.storage.cache import Admission, StaticPolicy, Universe
    keys = list(range(len(sizes)))
    capacity = int(fraction * sum(sizes))
    u = Universe(lambda: (np.array(keys, dtype=np.uint64), np.array(sizes)))
    tier = MemoryTier(capacity, StaticPolicy(1.0, capacity))
    for k in reversed(keys):                    # any order
        tier.put(k, b"x" * sizes[k], Admission(k, u))
    prefix, used = set(), 0
    for k in sorted(keys, key=rank):
        if used + sizes[k] > capacity:
            break
        prefix.add(k)
        used += sizes[k]
    assert {k for k in keys if tier.contains(k)} == prefix
    assert tier.used == used <= capacity and tier.stats()["refused"] == len(keys) - len(prefix)
    assert u.total == sum(sizes)


def test_ranks_vectorized_equal_rank():
    import numpy as np

    from pcrfs.storage.cache import ranks
    keys = [0, 1, 2, 1 << 40, (1 << 55) + 7, 2**64 - 1]
    assert ranks(np.array(keys, dtype=np.uint64)).tolist() == [rank(k) for k in keys]


def test_pending_writes_share_one_quota_and_overflow_is_written_not_dropped(tmp_path):
    """The disk tiers' pending entries draw on the memory budget's one share; an entry
    that does not fit is written at once (backpressure), so nothing is lost."""
    from pcrfs.storage.budget import MemoryBudget, Quota
    budget = MemoryBudget(1000)
    quota = Quota(budget.carve("pending_disk_writes", 300))
    assert budget.as_dict() == {"total": 1000, "pending_disk_writes": 300, "memory_tier": 700}
    a = DiskCache(str(tmp_path / "a"), 10**6, pending=quota)
    b = DiskCache(str(tmp_path / "b"), 10**6, pending=quota)
    assert quota.take(250)              # most of the share in use (a writer busy elsewhere)
    a.put_later("x", b"1" * 100)        # does not fit the share: written before returning
    assert a.stats()["pending_bytes"] == 0 and a.stats()["admitted"] == 1
    quota.give(250)
    b.put_later("y", b"2" * 100)
    a.close()
    b.close()
    assert a.get("x") == b"1" * 100 and b.get("y") == b"2" * 100 and quota.used == 0


def test_static_record_order_reader_gets_the_pinned_set_and_readahead(tmp_path):
    """Under static the memory tier pins the same rank-chosen images for a record-order
    reader as for a shuffled one (hits per epoch: exactly that set), and the readahead
    share keeps its in-order benefit: one extent per record, the rest of the record
    spliced from it."""
    from pcrfs.dataset import open_dataset
    from pcrfs.storage.budget import READAHEAD_SHARE
    from pcrfs.storage.reader import SEQUENTIAL_RUN
    from testkit.synthetic import build_synthetic
    build_synthetic(str(tmp_path / "ds"), classes=4, per_class=400, images_per_record=8)
    view = "q10"
    probe = open_dataset(str(tmp_path / "ds"))
    paths = sorted((p for p, _ in probe.index.iter_images()),
                   key=lambda p: (probe.lookup(p).record, probe.lookup(p).index))
    size = probe.file_size(paths[0], view)
    # the readahead share (1/16) must take a record's extent (8 images) at 1/4 of it
    budget = int(0.4 * size * len(paths))
    ds = open_dataset(str(tmp_path / "ds"), cache_size=budget, cache_policy="static")
    tiers = ds.cache_tiers()
    capacity = tiers["memory"]["capacity"]
    share = budget // READAHEAD_SHARE
    assert tiers["readahead"]["capacity"] == share and capacity == budget - share
    chosen = sorted(paths, key=lambda p: rank(ds.lookup(p).ordinal))[: capacity // size]
    records = len(ds.index.records)
    pinned_hits, extents, spliced = [], [], []
    for _ in range(3):
        before = (ds.stats.memory_image_hits, ds.stats.extent_fetches, ds.stats.cache_hits)
        for p in paths:
            assert ds.read(p, view) == probe.read(p, view)
        pinned_hits.append(ds.stats.memory_image_hits - before[0])
        extents.append(ds.stats.extent_fetches - before[1])
        spliced.append(ds.stats.cache_hits - before[2])
    assert pinned_hits == [0, len(chosen), len(chosen)]          # the pinned set, exactly
    # readahead in every epoch: in the first, one extent per record, the record's images
    # from its fifth on spliced from it; later, pinned images (served before the reader
    # sees them) make some records' runs too short to need one
    per_record = 8 - (SEQUENTIAL_RUN - 1)
    assert extents[0] == records and spliced[0] == records * per_record
    assert 0 < extents[1] == extents[2] and 0 < spliced[1] == spliced[2] < spliced[0]
    mem = ds.cache_tiers()["memory"]
    assert mem["evicted"] == 0 and mem["admitted"] == len(chosen) and mem["bytes"] <= capacity


def test_eviction_unlinks_without_holding_the_lock(tmp_path, monkeypatch):
    """The disk tier's lock is taken by readers and, for control-file lookups, by the trio
    thread: evicted files are unlinked after it is released, and an entry gone from disk
    is a plain miss."""
    import pcrfs.storage.diskcache as dc
    d = DiskCache(str(tmp_path / "c"), 3 * (1000 + dc.HEAD.size))
    held, real = [], os.unlink

    def unlink(path, *a, **kw):
        held.append(d._lock.locked())
        return real(path, *a, **kw)

    monkeypatch.setattr(dc.os, "unlink", unlink)
    for i in range(6):
        d.put(f"k{i}", bytes([i]) * 1000)
    assert held == [False, False, False]          # three evictions, none under the lock
    assert d.get("k0") is None and d.get("k5") == bytes([5]) * 1000
    os.remove(os.path.join(d.root, d._name("k4")))  # gone behind its back
    before = d.discarded
    assert d.get("k4") is None and d.discarded == before and not d.contains("k4")


def test_backends_and_tiers_answer_one_protocol_each(tmp_path):
    """Storage (LocalStorage, RemoteStorage) and Tier (MemoryTier, DiskCache) are the
    interfaces the reader and the views code against; each implementation has every
    member, and a tier's put says whether it kept the entry."""
    from pcrfs.storage import Storage
    from pcrfs.storage.cache import Tier
    from pcrfs.storage.local import LocalStorage
    from pcrfs.storage.remote import RemoteStorage
    for cls in (LocalStorage, RemoteStorage):
        missing = [m for m in ("splice", "pread", "cached_extent", "cached_segments",
                               "held_image", "sidecar", "read_file", "close")
                   if not callable(getattr(cls, m, None))]
        assert not missing, (cls, missing)
    assert isinstance(LocalStorage(str(tmp_path)), Storage)
    mem = MemoryTier(10)
    disk = DiskCache(str(tmp_path / "d"), 1 << 20)
    for tier in (mem, disk):
        assert isinstance(tier, Tier)
        assert tier.put("k", b"abc") is True and tier.contains("k") and tier.get("k") == b"abc"
        assert tier.stats()["admitted"] == 1
    assert mem.put("big", b"x" * 11) is False and not mem.contains("big")
    disk.close()
