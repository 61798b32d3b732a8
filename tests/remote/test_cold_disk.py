"""A remote dataset's cold reads in C: once its disk tier holds an image's segments, the
lane reads them from the tier's entry files (csrc/lane_cold.c, disk_entry), verifies both
the entry's checksum and the segment table's, and never asks Python or the network.  What
the tier lacks goes to Python, which fetches it; a damaged entry is dropped and fetched
again, never served.  Through the real kernel, against a real SeaweedFS."""
import os

import pcrfs
from pcrfs.storage.diskcache import HEAD, DiskCache
from remote.util import files_of, read, shuffled

from conftest import run_pcrfs, wait_until


def _lane(m) -> dict:
    return m.stats()["fast_lane"]


def _table_in_place(m) -> bool:
    return _lane(m)["segment_table_bytes"] > 0


def _entry(cache, local, rel: bytes, view: str, g: int):
    """The disk-tier file of segment g (0-based) of rel at view, as RemoteStorage keys it."""
    off, n = local.plan(rel, view).segments[g]
    key = f"{local.lookup(rel).record}:{off}:{n}"
    return cache / str(local.uuid) / "records" / DiskCache._name(key)


def _entries(cache, local, rel: bytes, view: str) -> list:
    """The entry files of rel's non-empty segments at view (an empty one has none)."""
    segs = local.plan(rel, view).segments
    return [_entry(cache, local, rel, view, g) for g, (_, n) in enumerate(segs) if n]


def _drop_extents(cache, local) -> None:
    """Remove the entries of whole extents (groups 1..k of a record), so every image's
    segments come from entries of their own."""
    for r, offs in local.index.records.items():
        for end in offs[1:]:
            key = f"{r}:{offs[0]}:{end - offs[0]}"
            (cache / str(local.uuid) / "records" / DiskCache._name(key)).unlink(missing_ok=True)


def test_cold_reads_of_a_remote_dataset_come_from_its_disk_tier_in_c(
        s3env, s3_corpus, corpus_ds, mount, tmp_path):
    local = pcrfs.open_dataset(str(corpus_ds))
    cache = tmp_path / "cache"
    files = files_of(local, "q5")
    # epoch 1, shuffled: every image's 5 segments fetched, one entry each
    m = mount(s3_corpus, "--cache-dir", cache)
    for rel in shuffled(files, 1):
        assert read(m.mnt, "q5", rel) == local.read(rel, "q5")
    first = m.stats()
    assert first["remote_bytes"] > 0
    m.__exit__(None, None, None)          # pending entries written

    # what the tier holds segment by segment; a shuffled reader that happened to look in
    # order fetched whole extents instead (one entry of a record's groups 1..k): the lane
    # reads those too
    own = {v: [p for p in files if all(e.exists() for e in _entries(cache, local, p, v))]
           for v in ("q5", "q1")}
    assert len(own["q5"]) >= len(files) // 2

    # epoch 2 on a fresh mount (its lane store is empty): q5 and q1 from the disk tier in
    # C, byte for byte; nothing fetched, no READ of those reaches Python
    m = mount(s3_corpus, "--cache-dir", cache, "-o", "lane_threads=2")
    wait_until(lambda: _table_in_place(m), 30, "the lane's segment table")
    assert _lane(m)["segment_source"] == "disk"
    before = m.stats()
    for view in ("q5", "q1"):
        for rel in shuffled(files, 2):
            assert read(m.mnt, view, rel) == local.read(rel, view), (view, rel)
    st = m.stats()
    lane, cold = st["fast_lane"], st["fast_lane"]["cold"]
    for view in ("q5", "q1"):
        assert cold[view]["files"] == len(files), view
        assert cold[view]["checksum_failures"] == cold[view]["handed_to_python"] == 0
        assert cold[view]["bytes"] == sum(local.file_size(p, view) for p in files)
    assert lane["disk_images_read"] == 2 * len(files) and lane["disk_images_missing"] == 0
    assert st["remote_requests"] == before["remote_requests"]      # no GET at all
    assert st["requests"]["read"] - before["requests"]["read"] <= 2   # stats.json's own
    # counted with Python's own disk-tier hits
    assert st["disk_cache_image_hits"] - before["disk_cache_image_hits"] == 2 * len(files)
    assert st["disk_cache_hits"] - before["disk_cache_hits"] == 2 * len(files)
    out = run_pcrfs("status", m.mnt).stdout
    assert f"from the disk tier: {2 * len(files)} files, 0 not held" in out, out

    # q10 needs segments 6..10, which the tier lacks: Python fetches only those
    g = f"q{local.groups}"
    rel = next(p for p in own["q5"] if local.lookup(p).scans > 5)
    before = m.stats()
    assert read(m.mnt, g, rel) == local.read(rel, g)
    st = m.stats()
    assert st["fast_lane"]["disk_images_missing"] == 1
    assert st["fast_lane"]["cold"][g]["handed_to_python"] == 1
    fetched = st["remote_bytes"] - before["remote_bytes"]
    assert 0 < fetched <= local.file_size(rel, g) - local.file_size(rel, "q5") + 2


def test_the_lane_takes_a_disk_tier_not_yet_made(s3env, s3_corpus, corpus_ds, mount,
                                                 tmp_path):
    """A first mount on a cache dir that does not exist yet (the disk tier makes it on its
    first write): the lane makes it when it starts, looks there first and hands what it
    lacks to Python.  Before, the lane failed to open the directory and took no table:
    every cold read of the mount, and of the epochs after, went through Python."""
    local = pcrfs.open_dataset(str(corpus_ds))
    cache = tmp_path / "not" / "yet"
    m = mount(s3_corpus, "--cache-dir", cache, "-o", "lane_threads=2")
    wait_until(lambda: _table_in_place(m), 30, "the lane's segment table")
    assert _lane(m)["segment_source"] == "disk"
    assert (cache / str(local.uuid) / "records").is_dir()
    files = files_of(local, "q3")[:6]
    for rel in files:       # the tier lacks them (Python fetches them), or an earlier GET
        assert read(m.mnt, "q3", rel) == local.read(rel, "q3")       # brought them along
    lane = _lane(m)
    assert lane["disk_images_missing"] >= 1
    assert lane["disk_images_missing"] + lane["disk_images_read"] == len(files), lane
    assert lane["cold"]["q3"]["files"] == lane["disk_images_read"]


def test_a_damaged_disk_tier_entry_is_never_served(s3env, s3_corpus, corpus_ds, mount,
                                                   tmp_path):
    """A flipped byte in one segment's entry, a torn entry and an entry with a foreign
    head: the lane gives each file to Python (counted as a checksum failure), which drops
    the entry and fetches the segment; every file reads exact, the others from C."""
    local = pcrfs.open_dataset(str(corpus_ds))
    cache = tmp_path / "cache"
    files = files_of(local, "q3")[:24]
    m = mount(s3_corpus, "--cache-dir", cache)
    for rel in shuffled(files, 3):
        assert read(m.mnt, "q3", rel) == local.read(rel, "q3")
    m.__exit__(None, None, None)

    _drop_extents(cache, local)       # (Python would read a damaged image from one)
    held = [p for p in files if all(e.exists() for e in _entries(cache, local, p, "q3"))]
    flipped, torn, foreign = [p for p in held if len(_entries(cache, local, p, "q3")) == 3][:3]
    e = _entry(cache, local, flipped, "q3", 1)
    raw = bytearray(e.read_bytes())
    raw[HEAD.size + (len(raw) - HEAD.size) // 2] ^= 0x04
    e.write_bytes(bytes(raw))
    e = _entry(cache, local, torn, "q3", 2)
    e.write_bytes(e.read_bytes()[:-1])
    e = _entry(cache, local, foreign, "q3", 0)
    e.write_bytes(b"NOTPCRFS" + e.read_bytes()[8:])

    m = mount(s3_corpus, "--cache-dir", cache)
    wait_until(lambda: _table_in_place(m), 30, "the lane's segment table")
    # the damaged ones first (a few reads: no in-order run, so Python reads each from its
    # own entries, not from an extent it would fetch)
    before = m.stats()
    for rel in (flipped, torn, foreign):
        assert read(m.mnt, "q3", rel) == local.read(rel, "q3"), rel
    st = m.stats()
    c = st["fast_lane"]["cold"]["q3"]
    assert c["checksum_failures"] == c["handed_to_python"] == 3 and c["files"] == 0
    assert st["disk_cache_discarded"] - before["disk_cache_discarded"] == 3
    assert st["remote_bytes"] > before["remote_bytes"]
    # every other file reads exact: from C where the tier holds it, else through Python
    for rel in files:
        assert read(m.mnt, "q3", rel) == local.read(rel, "q3"), rel
    st = m.stats()
    c = st["fast_lane"]["cold"]["q3"]
    assert c["checksum_failures"] == 3 and c["files"] >= len(held) - 3
    assert c["files"] + c["handed_to_python"] == len(files)
    assert st["checksum_failures"] == 0 and m.alive()


def test_entries_of_an_older_naming_are_removed_at_start(tmp_path):
    """Entries written by a pcrfs that named them by BLAKE2b are dropped when the tier
    opens (the lane could not find them), temporary files too; current ones are kept."""
    root = tmp_path / "tier"
    d = DiskCache(str(root), 1 << 20)
    d.put("1:2:3", b"abc")
    d.close()
    (root / ("0" * 32)).write_bytes(b"old")            # the former name of an entry
    (root / "x.tmp").write_bytes(b"half")
    d = DiskCache(str(root), 1 << 20)
    assert sorted(os.listdir(root)) == [DiskCache._name("1:2:3")]
    assert d.get("1:2:3") == b"abc" and d.used == HEAD.size + 3


def test_a_resealed_disk_tier_entry_is_fetched_again_not_eio(s3env, s3_corpus, corpus_ds,
                                                              mount, tmp_path):
    """An entry whose bytes were changed and whose head was sealed again (its own XXH3
    valid, the index's checksum not): the lane hands the file to Python, which drops the
    entry and reads the segment from the store; the file reads exact, never EIO
    (issue 84: it gave EIO once)."""
    import xxhash
    local = pcrfs.open_dataset(str(corpus_ds))
    cache = tmp_path / "cache"
    files = files_of(local, "q3")[:12]
    m = mount(s3_corpus, "--cache-dir", cache)
    for rel in files:
        assert read(m.mnt, "q3", rel) == local.read(rel, "q3")
    m.__exit__(None, None, None)
    _drop_extents(cache, local)
    rel = next(p for p in files if all(e.exists() for e in _entries(cache, local, p, "q3")))
    e = _entry(cache, local, rel, "q3", 0)
    raw = bytearray(e.read_bytes())
    payload = bytearray(raw[HEAD.size:])
    payload[len(payload) // 2] ^= 0x10
    e.write_bytes(HEAD.pack(b"PCRFSDC1", len(payload), xxhash.xxh3_64_intdigest(payload))
                  + payload)
    m = mount(s3_corpus, "--cache-dir", cache)
    before = m.stats()
    assert read(m.mnt, "q3", rel) == local.read(rel, "q3")
    st = m.stats()
    assert st["tier_damage_refetches"] - before["tier_damage_refetches"] == 1
    assert st["remote_bytes"] > before["remote_bytes"] and st["checksum_failures"] == 0
    assert not e.exists() or e.read_bytes() == raw       # dropped, or fetched again whole
