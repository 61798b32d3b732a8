"""-o cache_policy=static on a remote mount, through the kernel: over three shuffled
epochs the disk tier hits exactly the hash-chosen admitted set in every epoch after the
first (counted, not timed), and lru at the same capacity does not."""
import pcrfs
from pcrfs.storage.cache import rank
from pcrfs.storage.diskcache import HEAD
from remote.util import files_of, read, same_as_local, shuffled
from testkit.pages import CLEAN_PAGES, drop_page_cache


def _tier_hits(st) -> int:
    # a static memory tier pins a smaller subset of the same ranking (nested): those
    # images never reach the disk tier
    return st["disk_cache_image_hits"] + st["memory_image_hits"]


def _epochs(m, paths, local, view, n=3):
    hits = []
    for epoch in range(n):
        drop_page_cache(CLEAN_PAGES)   # the kernel's copy of every file
        before = _tier_hits(m.stats())
        for rel in shuffled(paths, epoch):
            assert same_as_local(read(m.mnt, view, rel), local, view, rel)
        hits.append(_tier_hits(m.stats()) - before)
    return hits


def test_static_disk_tier_hits_the_admitted_set_every_epoch(s3env, s3_corpus, corpus_ds, mount,
                                                            tmp_path):
    local = pcrfs.open_dataset(str(corpus_ds))
    view = "q3"
    paths = files_of(local, view)
    view_bytes = local.manifest["summary"]["total_bytes"][view]
    capacity = int(0.3 * view_bytes)
    # the lowest-ranked images whose segments (a header each) fit the disk tier
    chosen, used = set(), 0
    for p in sorted(paths, key=lambda p: rank(local.lookup(p).ordinal)):
        e = local.lookup(p)
        size = local.file_size(p, view) - 2 + HEAD.size * min(3, e.scans)
        if used + size > capacity:
            break
        chosen.add(p)
        used += size
    assert 0 < len(chosen) < len(paths)
    # fast_lane=no: the lane's own image store would answer re-reads before Python;
    # a tiny memory tier: no record extents, every image from its segments
    common = ("--cache-dir-size", str(capacity), "--cache-size", "256k")
    m = mount(s3_corpus, "--cache-dir", tmp_path / "static", *common,
              "-o", "cache_policy=static,fast_lane=no")
    hits = _epochs(m, paths, local, view)
    disk = m.stats()["cache_tiers"]["disk"]
    admitted = disk["admitted"] // 3              # three segment entries per image at q3
    assert hits == [0, admitted, admitted]        # exactly the admitted set, every epoch
    assert disk["policy"] == "static" and disk["evicted"] == 0
    assert admitted == len(chosen) and disk["bytes"] == used <= capacity   # filled exactly
    assert m.stats()["cache_tiers"]["memory"]["policy"] == "static"
    # the same capacity under lru keeps the most recent images, which a shuffled epoch
    # mostly evicts before it reads them again
    m2 = mount(s3_corpus, "--cache-dir", tmp_path / "lru", *common, "-o", "fast_lane=no")
    lru = _epochs(m2, paths, local, view)
    assert lru[0] == 0 and max(lru[1:]) < admitted
    assert m2.stats()["cache_tiers"]["disk"]["policy"] == "lru"
