"""The data plane: files the lane has never seen, served in C from the records through the
segment table (csrc/lane_cold.c, pcrfs/format/segtab.py), on several lane threads, each
reading its own clone of /dev/fuse.  Through the real kernel, against the Python path."""
import errno
import hashlib
import os
import random
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import pcrfs
from pcrfs.format import segtab

from conftest import run_pcrfs, wait_until
from test_build import image_paths


def cold(m) -> dict:
    return m.stats()["fast_lane"]["cold"]


def lane_threads(pid: int) -> list[str]:
    names = []
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            names.append(open(f"/proc/{pid}/task/{t}/comm").read().strip())
        except FileNotFoundError:
            pass
    return sorted(n for n in names if n.startswith("pcrfs-lane"))


def test_segment_table_matches_the_index(crops_ds):
    ds = pcrfs.open_dataset(str(crops_ds))
    t = segtab.parse(segtab.derive(ds.index, ds.groups).tobytes())
    assert t["groups"] == ds.groups and t["images"] == ds.manifest["images"]
    for path in list(image_paths(ds))[::17]:
        e = ds.lookup(path)
        slot = int(t["first"][e.record]) + e.index
        assert t["scans"][slot] == e.scans
        for k in (1, 5, ds.groups):
            plan = ds.plan(path, f"q{k}")
            n = min(k, e.scans)
            segs = [(int(t["group_offsets"][e.record][g]) + int(t["segments"][slot, g, 0]),
                     int(t["segments"][slot, g, 1])) for g in range(n)]
            assert segs == list(plan.segments)
            assert [int(c) for c in t["segments"][slot, :n, 2]] == list(plan.checksums)


def test_cold_reads_in_c_equal_python_in_every_view(crops_ds, mount):
    """A fresh mount's first read of each file comes from the records in C, byte for byte
    what the Python path serves, in every q view; dynamic/ and l3/ (from Python or, once
    transcoded, the lane) are equal too.  Counted per view, as Python counts its own."""
    m = mount(crops_ds, "-o", "lane_threads=4")
    ref = mount(crops_ds, "-o", "fast_lane=no")
    wait_until(lambda: m.stats()["fast_lane"]["threads"] == 4, 5, "4 lane threads")
    assert len(lane_threads(m.pid)) == 4
    ds = pcrfs.open_dataset(str(crops_ds))
    paths = [os.fsdecode(p) for p in image_paths(ds)][:40]
    wait_until(lambda: table_in_place(m), 20, "the lane's segment table")
    views = ("q1", "q5", f"q{ds.groups}")
    before = m.stats()
    for v in views:
        for p in paths[:-1]:
            got = (m.mnt / v / p).read_bytes()
            assert got == (ref.mnt / v / p).read_bytes() == ds.read(p, v), (v, p)
            assert os.stat(m.mnt / v / p).st_size == len(got)
    # Python read none of those files: only stats.json's READs reached it
    assert m.stats()["requests"]["read"] - before["requests"]["read"] <= 2
    for v in ("dynamic", "l3"):
        for p in paths[:5]:
            q = p if v == "dynamic" else p.rsplit(".", 1)[0] + ".l3"
            assert (m.mnt / v / q).read_bytes() == (ref.mnt / v / q).read_bytes()
    s = m.stats()
    c = s["fast_lane"]["cold"]
    for v in views:
        assert c[v]["files"] - before["fast_lane"]["cold"].get(v, {}).get("files", 0) == \
            len(paths) - 1, v
        assert c[v]["checksum_failures"] == 0 and c[v]["handed_to_python"] == 0
        want = sum(ds.stat(p, v).size for p in paths[:-1])
        assert c[v]["bytes"] - before["fast_lane"]["cold"].get(v, {}).get("bytes", 0) == want
        assert s["served_files"][v] >= len(paths) - 1
    assert s["fast_lane"]["routed_replies"] > 0      # Python's answers went to the clones
    out = run_pcrfs("status", m.mnt).stdout
    cold_line = next(x for x in out.splitlines() if x.startswith("cold reads  "))
    assert "(1 of 4 lane threads)" in out and " q1 39 files" in cold_line.replace(",", "")
    assert "segments    table mapped from index.segtab (" in out, out


def table_in_place(m) -> bool:
    """Whether the lane's segment table is in place (derived in a thread at mount)."""
    return m.stats()["fast_lane"]["segment_table_bytes"] > 0


def test_getattr_of_unkept_files_answered_from_the_table(crops_ds, mount):
    """A READ makes the kernel drop the file's cached atime, so its next stat() is a
    GETATTR.  With a lane store that keeps only the last few images, those of the files
    it no longer holds are answered from the segment table: the right size, and Python is
    not asked."""
    m = mount(crops_ds, "--cache-size", "1M", "-o", "lane_threads=2")
    ds = pcrfs.open_dataset(str(crops_ds))
    paths = [os.fsdecode(p) for p in image_paths(ds)]
    wait_until(lambda: table_in_place(m), 20, "the lane's segment table")
    for p in paths:
        with open(m.mnt / "q10" / p, "rb") as f:
            assert f.read() == ds.read(p, "q10")
    before = m.stats()
    for p in paths:
        assert os.stat(m.mnt / "q10" / p).st_size == ds.stat(p, "q10").size
    s = m.stats()
    assert s["fast_lane"]["store_images"] < len(paths) // 4
    assert s["fast_lane"]["cold_getattr"] - before["fast_lane"]["cold_getattr"] >= \
        len(paths) - s["fast_lane"]["store_images"]
    # (stats.json, a live file, costs Python a few GETATTRs of its own)
    assert s["requests"].get("getattr", 0) - before["requests"].get("getattr", 0) <= 6


def names_in_place(m) -> bool:
    """Whether the lane answers LOOKUP of q-view files (the names follow the table)."""
    return m.stats()["fast_lane"]["lookup_names"]


def test_lookup_of_never_listed_files_answered_in_c(crops_ds, mount):
    """A path opened without a listing first is a LOOKUP per component.  The lane answers
    those of q-view files from the segment table's names: the inode and size Python would
    give, negative and directory lookups still Python's.  Python then answers the requests
    it still gets about such a file (listxattr, utime), though it never saw the lookup."""
    m = mount(crops_ds, "-o", "lane_threads=2", "-o", "readdirplus=no")
    ref = mount(crops_ds, "-o", "fast_lane=no")
    wait_until(lambda: names_in_place(m), 20, "the lane's name table")
    ds = pcrfs.open_dataset(str(crops_ds))
    paths = [os.fsdecode(p) for p in image_paths(ds)]
    before = m.stats()
    for v in ("q3", "q10"):
        for p in paths:
            st, want = os.stat(m.mnt / v / p), os.stat(ref.mnt / v / p)
            assert (st.st_ino, st.st_size, st.st_mode) == \
                (want.st_ino, want.st_size, want.st_mode), (v, p)
            assert (m.mnt / v / p).read_bytes() == ds.read(p, v)
    s = m.stats()
    looked = s["fast_lane"]["cold_lookup"] - before["fast_lane"]["cold_lookup"]
    assert looked == 2 * len(paths)
    # Python looked up only the two views and their class directories
    python = (s["requests"]["lookup"] - before["requests"].get("lookup", 0)) - looked
    assert python <= 2 * (1 + 8), python
    assert s["requests"]["read"] - before["requests"]["read"] <= 2   # stats.json's
    # names that are no file of that directory: Python, as before
    for bad in ("class_00/nope.jpg", paths[0] + "x", paths[0].upper()):
        assert not (m.mnt / "q3" / bad).exists()
    assert sorted(os.listdir(m.mnt / "q3" / Path(paths[0]).parent)) == \
        sorted(os.listdir(ref.mnt / "q3" / Path(paths[0]).parent))
    # requests about a file Python never looked up: it names the inode from the table
    p = m.mnt / "q10" / paths[-1]
    assert sorted(os.listxattr(p)) == sorted(os.listxattr(ref.mnt / "q10" / paths[-1]))
    with pytest.raises(OSError) as e:
        os.utime(p)
    assert e.value.errno == errno.EROFS
    assert m.alive()


def test_lookups_the_lane_answers_leave_listings_bare(crops_ds, mount):
    """readdirplus=auto gives listings attributes once listed files are stat'ed through
    Python (test_mount).  Stats the lane answers cost Python nothing, about what a listed
    file's attributes cost it: the next listing stays bare."""
    m = mount(crops_ds, "-o", "lane_threads=2")
    wait_until(lambda: names_in_place(m), 20, "the lane's name table")
    classes = sorted(os.listdir(m.mnt / "q1"))
    d = m.mnt / "q1" / classes[0]
    for n in os.listdir(d):
        os.stat(d / n)
    before = m.stats()
    assert before["fast_lane"]["cold_lookup"] == 30
    os.listdir(m.mnt / "q1" / classes[1])
    s = m.stats()
    # (. and .. always carry attributes)
    assert s["readdir_entries"]["attrs"] - before["readdir_entries"]["attrs"] == 2
    assert s["readdir_entries"]["bare"] - before["readdir_entries"]["bare"] == 30


def test_table_file_written_at_build_and_mapped_at_mount(small_src, tmp_path, mount):
    """build writes the segment table and the q views' names beside the index
    (index.segtab); a mount maps it instead of deriving it, and serves from it exactly
    what it serves from a derived one.  It is tied to its index: reindex writes a new one,
    and a dataset without one (an older build) derives it as before."""
    dst = tmp_path / "ds"
    run_pcrfs("build", small_src, dst, "--images-per-record", 8, "-q")
    assert (dst / segtab.FILE).is_file()
    ds = pcrfs.open_dataset(str(dst))
    table, names = segtab.load_file(str(dst), ds.index, ds.manifest)
    derived = segtab.derive(ds.index, ds.groups)
    assert table is not None and table.tobytes() == derived.tobytes()
    fresh = segtab.Names.derive(ds.index, derived)
    for a in ("dir", "off", "blob"):
        assert np.array_equal(getattr(names, a), getattr(fresh, a)), a
    assert names.dirs == fresh.dirs
    want = {p: ds.read(p, "q4") for p in image_paths(ds)}

    def serves(source: str) -> None:
        m = mount(dst, "-o", "lane_threads=2")
        wait_until(lambda: names_in_place(m), 20, "the lane's segment table and names")
        assert m.stats()["fast_lane"]["segment_table"] == source
        for p, data in want.items():
            assert (m.mnt / "q4" / os.fsdecode(p)).read_bytes() == data, p
        s = m.stats()["fast_lane"]
        assert s["cold"]["q4"]["files"] == len(want) and s["cold_lookup"] == len(want)
        m.__exit__(None, None, None)

    serves("file")
    m = mount(dst)
    wait_until(lambda: names_in_place(m), 20, "the lane's segment table and names")
    os.stat(m.mnt / "q2" / os.fsdecode(next(iter(want))))
    out = run_pcrfs("status", m.mnt).stdout
    assert "segments    table mapped from index.segtab (" in out, out
    assert "; 1 lookups answered by name" in out, out
    m.__exit__(None, None, None)
    (dst / segtab.FILE).unlink()                          # a dataset built before it
    serves("derived")
    assert "reindexed" in run_pcrfs("reindex", dst).stdout    # writes one for its index
    again = pcrfs.open_dataset(str(dst))
    assert segtab.load_file(str(dst), again.index, again.manifest)[0] is not None


def test_a_damaged_or_foreign_table_file_is_not_used(small_src, tmp_path, mount):
    """A byte flipped where it could make one file another's (names, record starts) fails
    the file's checksum: the mount derives the table and says why.  A table made for
    another index is not used either.  A flipped segment row is left to the lane's
    segment checksum: that file goes to Python, which serves its right bytes."""
    dst = tmp_path / "ds"
    run_pcrfs("build", small_src, dst, "--images-per-record", 8, "-q")
    ds = pcrfs.open_dataset(str(dst))
    want = {p: ds.read(p, "q4") for p in image_paths(ds)}
    good = (dst / segtab.FILE).read_bytes()
    table = segtab.derive(ds.index, ds.groups)

    def read_all(m) -> None:
        wait_until(lambda: table_in_place(m), 20, "the lane's segment table")
        for p, data in want.items():
            assert (m.mnt / "q4" / os.fsdecode(p)).read_bytes() == data, p

    for where in (len(good) - 1, 64 + segtab.HEADER.size + 3):   # a name; first[0]
        bad = bytearray(good)
        bad[where] ^= 0x08
        (dst / segtab.FILE).write_bytes(bytes(bad))
        log = tmp_path / f"daemon-{where}.log"
        m = mount(dst, "--log", log)
        read_all(m)
        assert m.stats()["fast_lane"]["segment_table"] == "derived"
        assert "damaged (checksum)" in log.read_text()
        m.__exit__(None, None, None)

    other = tmp_path / "other"
    run_pcrfs("build", small_src, other, "--images-per-record", 6, "-q")
    (dst / segtab.FILE).write_bytes((other / segtab.FILE).read_bytes())
    m = mount(dst, "--log", tmp_path / "foreign.log")
    read_all(m)
    assert m.stats()["fast_lane"]["segment_table"] == "derived"
    assert "made for another index" in (tmp_path / "foreign.log").read_text()
    m.__exit__(None, None, None)

    # slot 0, group 1: its checksum, in the rows the file's checksum leaves out
    bad = bytearray(good)
    bad[64 + segtab._seg_start(table) + 8] ^= 0x01
    (dst / segtab.FILE).write_bytes(bytes(bad))
    m = mount(dst)
    read_all(m)
    s = m.stats()["fast_lane"]
    assert s["segment_table"] == "file"
    assert s["cold"]["q4"]["checksum_failures"] == 1 and s["cold"]["q4"]["handed_to_python"] == 1


def test_a_flipped_byte_gives_eio_for_that_file_alone(small_src, tmp_path, mount):
    """The lane's checksum catches it, hands the file to Python, which reads it again and
    answers EIO; every other file of the same record is served cold, intact."""
    dst = tmp_path / "ds"
    run_pcrfs("build", small_src, dst, "--images-per-record", 8, "-q", "--views", "none")
    ds = pcrfs.open_dataset(str(dst))
    victim = b"c1/im04.jpg"
    e = ds.lookup(victim)
    off, ln = ds.plan(victim, "q3").segments[2]
    rec = dst / "records" / f"r{e.record:06d}.pcr"
    raw = bytearray(rec.read_bytes())
    raw[off + ln // 2] ^= 0x40
    rec.write_bytes(raw)
    m = mount(dst, "-o", "lane_threads=3")
    others = [p for p in image_paths(ds) if p != victim]
    wait_until(lambda: table_in_place(m), 20, "the lane's segment table")
    assert (m.mnt / "q2" / "c1" / "im04.jpg").read_bytes() == ds.read(victim, "q2")  # before it
    with pytest.raises(OSError) as ei:
        (m.mnt / "q3" / "c1" / "im04.jpg").read_bytes()
    assert ei.value.errno == errno.EIO
    for p in others:
        assert (m.mnt / "q3" / os.fsdecode(p)).read_bytes() == ds.read(p, "q3")
    s = m.stats()
    c = s["fast_lane"]["cold"]["q3"]
    assert c["checksum_failures"] >= 1 and c["handed_to_python"] >= 1
    assert c["files"] == len(others)
    assert s["checksum_failures"] >= 1 and s["errors"]["EIO"] >= 1


def test_cached_l3_files_served_cold_from_the_transcode_tier(crops_ds, tmp_path, mount):
    """l3/ files transcoded by one mount are read by the next one's lane from the disk
    tier in C (entry checksum and size checked), byte for byte, with no transcode and no
    READ in Python; a flipped byte in one entry hands that file to Python, which drops the
    entry and transcodes it again."""
    from pcrfs.storage.diskcache import HEAD, DiskCache
    from pcrfs.views.l3 import L3View
    cache = tmp_path / "cache"
    ds = pcrfs.open_dataset(str(crops_ds))
    paths = [os.fsdecode(p).rsplit(".", 1)[0] + ".l3" for p in image_paths(ds)][:12]
    m = mount(crops_ds, "--cache-dir", cache)
    want = {p: (m.mnt / "l3" / p).read_bytes() for p in paths}
    assert m.stats()["transcodes"] == len(paths)
    m.__exit__(None, None, None)

    victim = paths[5]
    src = next(q for q in image_paths(ds) if os.fsdecode(q).rsplit(".", 1)[0] + ".l3" == victim)
    entry = cache / str(ds.uuid) / "l3" / DiskCache._name(L3View.cache_key(ds.lookup(src).ordinal))
    raw = bytearray(entry.read_bytes())
    raw[HEAD.size + 100] ^= 0x01
    entry.write_bytes(bytes(raw))

    m = mount(crops_ds, "--cache-dir", cache, "-o", "lane_threads=2")
    wait_until(lambda: "l3" in m.stats()["fast_lane"]["cold_views"], 20,
               "the lane serving l3/ cold")
    before = m.stats()
    for p in paths:
        assert (m.mnt / "l3" / p).read_bytes() == want[p], p
        assert os.stat(m.mnt / "l3" / p).st_size == len(want[p])
    st = m.stats()
    c = st["fast_lane"]["cold"]["l3"]
    assert c["files"] == len(paths) - 1 and c["bytes"] == sum(
        len(v) for p, v in want.items() if p != victim)
    assert c["checksum_failures"] == c["handed_to_python"] == 1
    assert st["transcodes"] - before["transcodes"] == 1              # the victim alone
    assert st["transcode_cache_hits"] - before["transcode_cache_hits"] == len(paths) - 1
    assert st["requests"]["read"] - before["requests"]["read"] <= 2 + 1   # + the victim
    assert entry.read_bytes()[HEAD.size:] == want[victim]            # written again, intact


def test_a_replaced_l3_entry_is_never_served_on_its_own_checksum(crops_ds, tmp_path, mount):
    """An l3/ transcode-tier entry whose bytes were changed and whose head was sealed
    again (its own XXH3 valid): the lane checks it against the build's sidecar, hands it
    to Python, which transcodes again; the file reads exact (issue 84: served wrong, 8 of
    8)."""
    import xxhash

    from pcrfs.storage.diskcache import HEAD, DiskCache
    from pcrfs.views.l3 import L3View
    cache = tmp_path / "cache"
    ds = pcrfs.open_dataset(str(crops_ds))
    srcs = list(image_paths(ds))[:8]
    paths = [os.fsdecode(p).rsplit(".", 1)[0] + ".l3" for p in srcs]
    m = mount(crops_ds, "--cache-dir", cache)
    want = {p: (m.mnt / "l3" / p).read_bytes() for p in paths}
    m.__exit__(None, None, None)
    for src in srcs:
        entry = cache / str(ds.uuid) / "l3" / DiskCache._name(L3View.cache_key(ds.lookup(src).ordinal))
        payload = bytearray(entry.read_bytes()[HEAD.size:])
        payload[len(payload) // 2] ^= 0x20
        entry.write_bytes(HEAD.pack(b"PCRFSDC1", len(payload), xxhash.xxh3_64_intdigest(payload))
                          + payload)
    m = mount(crops_ds, "--cache-dir", cache)
    wait_until(lambda: "l3" in m.stats()["fast_lane"]["cold_views"], 20,
               "the lane serving l3/ cold")
    before = m.stats()
    for p in paths:
        assert (m.mnt / "l3" / p).read_bytes() == want[p], p
    st = m.stats()
    c = st["fast_lane"]["cold"]["l3"]
    assert c["files"] == 0 and c["checksum_failures"] == len(paths)
    assert st["transcodes"] - before["transcodes"] == len(paths)


def test_lane_starts_on_a_cache_dir_not_yet_made(crops_ds, tmp_path, mount):
    """A disk cache makes its directory on its first write (a user with no home mounts);
    the lane, which keeps l3/'s directory open for the transcodes written later, makes it
    when it starts.  Before, it failed to open it and took the name table down with it:
    every cold LOOKUP went to Python."""
    cache = tmp_path / "not" / "yet"
    m = mount(crops_ds, "--cache-dir", cache, "-o", "lane_threads=2")
    wait_until(lambda: names_in_place(m), 20, "the lane's name table")
    assert "l3" in m.stats()["fast_lane"]["cold_views"]
    ds = pcrfs.open_dataset(str(crops_ds))
    assert (cache / str(ds.uuid) / "l3").is_dir()
    p = os.fsdecode(next(iter(image_paths(ds))))
    assert (m.mnt / "q2" / p).read_bytes() == ds.read(p.encode(), "q2")
    assert m.stats()["fast_lane"]["cold_lookup"] >= 1


def test_lane_cold_no_and_static_cache_leave_reads_to_python(crops_ds, mount):
    ds = pcrfs.open_dataset(str(crops_ds))
    p = os.fsdecode(next(iter(image_paths(ds))))
    for args in (("-o", "lane_cold=no"), ("-o", "cache_policy=static"),
                 ("--bandwidth-limit", "100M")):
        m = mount(crops_ds, *args)
        assert (m.mnt / "q4" / p).read_bytes() == ds.read(p, "q4")
        assert m.stats()["fast_lane"]["cold"] == {}, args
        assert m.stats()["served_files"]["q4"] == 1


def test_default_lane_threads_are_a_quarter_of_the_cores_and_a_mount_runs_them(crops_ds, mount):
    """The default chosen from the 16-core sweep (4 threads beat 8 and 16 at 8-16 readers):
    a quarter of the cores, at least 2, never more than the cores; a default mount starts
    exactly that many, each with its own /dev/fuse clone."""
    from pcrfs.fs.options import default_lane_threads
    assert [default_lane_threads(c) for c in (1, 2, 3, 8, 16, 64)] == [1, 2, 2, 2, 4, 16]
    m = mount(crops_ds)
    want = default_lane_threads(os.cpu_count() or 1)
    wait_until(lambda: m.stats()["fast_lane"]["threads"] == want, 5, f"{want} lane threads")
    assert len(lane_threads(m.pid)) == want


@pytest.mark.parametrize("bad", ["lane_threads=0", "lane_threads=x", "lane_threads=257",
                                 "lane_cold=maybe"])
def test_bad_lane_options_are_refused(crops_ds, tmp_path, bad):
    (tmp_path / "m").mkdir()
    r = run_pcrfs("mount", crops_ds, tmp_path / "m", "-o", bad, check=False)
    assert r.returncode != 0 and bad.split("=")[0] in r.stderr


def test_readers_across_lane_threads_never_see_a_wrong_byte(crops_ds, mount):
    """32 readers over 8 lane threads, each read after its page cache is dropped, so the
    lane's store, its cold path and Python all serve at once, with a store too small for
    the data (evictions): every file equals its digest, and unmount joins every thread."""
    seconds = float(os.environ.get("PCRFS_DATAPLANE_SECONDS", "10"))   # make soak: 60
    m = mount(crops_ds, "--cache-size", "24M", "-o", "lane_threads=8")
    ds = pcrfs.open_dataset(str(crops_ds))
    views = ("q1", "q4", "q7", f"q{ds.groups}", "dynamic")
    paths = [os.fsdecode(p) for p in image_paths(ds)]
    want = {(v, p): hashlib.blake2b(ds.read(p, "q10" if v == "dynamic" else v)).digest()
            for v in views for p in paths}
    wait_until(lambda: len(lane_threads(m.pid)) == 8, 5, "8 lane threads")
    deadline = time.monotonic() + seconds
    bad, errors, reads = [], [], [0]

    def reader(i):
        rng = random.Random(i)
        n = 0
        while time.monotonic() < deadline:
            v, p = rng.choice(views), rng.choice(paths)
            f = m.mnt / v / p
            try:
                fd = os.open(f, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    chunks = []
                    while chunk := os.read(fd, 1 << 16):
                        chunks.append(chunk)
                finally:
                    os.close(fd)
            except OSError as e:
                errors.append((v, p, e))
                continue
            if hashlib.blake2b(b"".join(chunks)).digest() != want[(v, p)]:
                bad.append((v, p))
            n += 1
        reads[0] += n

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = m.stats()
    print(f"{reads[0]} reads in {seconds:.0f} s; lane: {s['fast_lane']['read']} from the "
          f"store, {sum(c['files'] for c in s['fast_lane']['cold'].values())} cold, "
          f"{s['fast_lane']['routed_replies']} replies routed to clones")
    assert not bad and not errors and reads[0] > 1000
    assert sum(c["files"] for c in s["fast_lane"]["cold"].values()) > 0
    assert s["fast_lane"]["read"] > 0 and s["fast_lane"]["routed_replies"] > 0
    assert s["fast_lane"]["store_bytes"] <= s["fast_lane"]["store_budget"]
    assert s["errors"] == {}
    pid = m.pid
    m.__exit__(None, None, None)
    wait_until(lambda: not os.path.exists(f"/proc/{pid}"), 10, "the daemon to exit")


def test_raw_and_mix_ppms_served_cold_from_the_packs(small_src, tmp_path, mount):
    """raw/ and mix/ files the packs hold are read from them in C, byte for byte what
    Python serves; mix's JPEGs come from the records; an image no pack holds, and a
    damaged item, go to Python (decoded, or EIO for that file alone)."""
    dst = tmp_path / "ds"
    run_pcrfs("build", small_src, dst, "--images-per-record", 8, "-q", "--views", "none")
    run_pcrfs("materialize", dst, "raw", "--fraction", "0.6", "-q")
    ref = mount(dst, "-o", "fast_lane=no,mix=0.5,mix_fidelity=3")
    m = mount(dst, "-o", "mix=0.5,mix_fidelity=3,lane_threads=3")
    wait_until(lambda: names_in_place(m), 20, "the lane's segment table and names")
    want = {f.relative_to(ref.mnt): f.read_bytes() for v in ("raw", "mix")
            for f in sorted((ref.mnt / v).rglob("*")) if f.is_file()}
    for rel, data in want.items():
        assert (m.mnt / rel).read_bytes() == data, rel
    s = m.stats()
    c = s["fast_lane"]["cold"]
    ds = pcrfs.open_dataset(str(dst))
    import numpy as np

    from pcrfs.liquid.rules import raw_mask
    ords = np.array([e.ordinal for _, e in ds.index.iter_images()], dtype=np.uint64)
    stored = int(raw_mask(ords, 0.6).sum())
    mix_raw = int(raw_mask(ords, 0.5).sum())
    assert c["raw"]["pack_items"] == c["raw"]["files"] == stored
    assert c["mix"]["pack_items"] == mix_raw and c["mix"]["files"] == len(ords)
    assert c["mix"]["read_bytes"] > 0                    # its JPEGs, from the records
    assert s["raw_decodes"] == len(ords) - stored        # the rest: Python decodes
    assert s["raw_pack_reads"] == stored + mix_raw
    # raw/ files the packs hold were looked up in C (foo.jpg -> foo.ppm), and every mix/
    # file (its PPM's name where mix/ serves the PPM, all of which the packs hold here:
    # the shares nest); the raw/ files Python decodes, by Python
    assert mix_raw <= stored
    assert s["fast_lane"]["cold_lookup"] == stored + len(ords)
    # Python names those inodes too (here: SETATTR, which it refuses as for any file)
    mix_files = [rel for rel in want if rel.parts[0] == "mix"]
    for rel in (next(r for r in mix_files if r.suffix == ".ppm"),
                next(r for r in mix_files if r.suffix != ".ppm")):
        with pytest.raises(OSError) as e:
            os.utime(m.mnt / rel)
        assert e.value.errno == errno.EROFS, rel
    m.__exit__(None, None, None)

    # one flipped byte in a pack item: the lane's XXH3 catches it, Python says EIO
    from pcrfs.format.rawpack import HEAD, count_of, decode, head_size, pack_key
    data = (dst / pack_key(0)).read_bytes()
    pack = decode(data[: head_size(count_of(data[: HEAD.size], "p"))], "p", ds.uuid, 0)
    victim = int(pack.items["index"][0])
    off, n, _ = pack.find(victim)
    buf = bytearray(data)
    buf[off + n // 2] ^= 0x40
    (dst / pack_key(0)).write_bytes(bytes(buf))
    m = mount(dst, "-o", "lane_threads=2")
    wait_until(lambda: names_in_place(m), 20, "the lane's segment table and names")
    names = {e.index: p for p, e in ds.index.iter_images() if e.record == 0}
    raw_name = lambda p: os.fsdecode(p).rsplit(".", 1)[0] + ".ppm"   # noqa: E731
    with pytest.raises(OSError) as ei:
        (m.mnt / "raw" / raw_name(names[victim])).read_bytes()
    assert ei.value.errno == errno.EIO
    for i in (int(x) for x in pack.items["index"][1:]):
        p = raw_name(names[i])
        assert (m.mnt / "raw" / p).read_bytes() == want[Path("raw") / p]
    c = m.stats()["fast_lane"]["cold"]["raw"]
    assert c["checksum_failures"] >= 1 and c["handed_to_python"] >= 1
    assert c["files"] == len(pack.items) - 1


def test_dynamic_files_read_by_the_lane_at_the_fidelity_they_were_opened(small_src, tmp_path,
                                                                          mount):
    """dynamic/ files are opened with the inode of the q-view file they read, so the lane
    serves them (cold, in C); an open file keeps its fidelity across a switch; a damaged
    segment is EIO through dynamic/ too (the READ the lane hands back finds its file)."""
    from pcrfs import control
    dst = tmp_path / "ds"
    run_pcrfs("build", small_src, dst, "--images-per-record", 8, "-q", "--views", "none")
    ds = pcrfs.open_dataset(str(dst))
    paths = [os.fsdecode(p) for p in image_paths(ds)]
    victim = paths[-1]
    e = ds.lookup(os.fsencode(victim))
    off, ln = ds.plan(os.fsencode(victim), "q4").segments[3]
    rec = dst / "records" / f"r{e.record:06d}.pcr"
    raw = bytearray(rec.read_bytes())
    raw[off + ln // 2] ^= 0x10
    rec.write_bytes(raw)
    m = mount(dst, "--fidelity", "3", "-o", "lane_threads=2")
    wait_until(lambda: table_in_place(m), 20, "the lane's segment table")
    before = m.stats()
    for p in paths[:-1]:
        assert (m.mnt / "dynamic" / p).read_bytes() == ds.read(p, "q3")
    s = m.stats()
    assert s["fast_lane"]["cold"]["q3"]["files"] == len(paths) - 1
    assert s["requests"]["read"] - before["requests"]["read"] <= 2     # stats.json's own
    with open(m.mnt / "dynamic" / paths[0], "rb") as held:
        control.set_fidelity(m.mnt, 5)
        assert held.read() == ds.read(paths[0], "q3")      # opened at q3, stays q3
    assert (m.mnt / "dynamic" / paths[0]).read_bytes() == ds.read(paths[0], "q5")
    assert m.stats()["fast_lane"]["cold"]["q5"]["files"] >= 1
    control.set_fidelity(m.mnt, 3)                       # its damage is in scan 4
    assert (m.mnt / "dynamic" / victim).read_bytes() == ds.read(victim, "q3")
    control.set_fidelity(m.mnt, 4)
    with pytest.raises(OSError) as ei:
        (m.mnt / "dynamic" / victim).read_bytes()
    assert ei.value.errno == errno.EIO
    assert m.stats()["fast_lane"]["cold"]["q4"]["checksum_failures"] >= 1
