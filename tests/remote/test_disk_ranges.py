"""A random read of one image from a record extent held in the disk tier reads that
image's segments only (counted in bytes read from the cache file), and a damaged extent
entry is dropped and the image fetched again, never served wrong."""
import pcrfs
from pcrfs.storage.diskcache import HEAD, DiskCache
from remote.util import in_record_order, read

VIEW, K = "q5", 5


def _extent_entry(cache, local, record: int):
    """The disk-tier file of record's extent of groups 1..K, as the reader keys it."""
    offs = local.index.records[record]
    k = min(K, len(offs) - 1)
    key = f"{record}:{offs[0]}:{offs[k] - offs[0]}"
    return cache / str(local.uuid) / "records" / DiskCache._name(key), offs[0]


def test_random_read_from_a_cached_extent_reads_only_its_image(s3env, s3_corpus, corpus_ds,
                                                              mount, tmp_path):
    local = pcrfs.open_dataset(str(corpus_ds))
    cache = tmp_path / "cache"
    order = in_record_order(local, VIEW)
    m = mount(s3_corpus, "--cache-dir", cache, "-o", "fast_lane=no")
    for rel in order:                     # record order: whole extents, into the disk tier
        assert read(m.mnt, VIEW, rel) == local.read(rel, VIEW)
    assert m.stats()["extent_fetches"] > 0
    m.__exit__(None, None, None)          # pending entries written, memory gone

    # images whose record's extent is on disk, past the first few of their record (those
    # were read before the extent, and their segments are entries of their own)
    held = [rel for rel in order if local.lookup(rel).index >= 8
            and _extent_entry(cache, local, local.lookup(rel).record)[0].exists()]
    assert len(held) >= 4
    pick, damaged = held[len(held) // 2], held[len(held) // 2 + 1]
    m = mount(s3_corpus, "--cache-dir", cache, "-o", "fast_lane=no")
    before = m.stats()
    assert read(m.mnt, VIEW, pick) == local.read(pick, VIEW)
    after = m.stats()
    disk_read = after["cache_tiers"]["disk"]["bytes_read"] - before["cache_tiers"]["disk"]["bytes_read"]
    assert disk_read == local.file_size(pick, VIEW) - 2      # its segments, no EOI, nothing else
    assert after["remote_bytes"] == before["remote_bytes"]   # and nothing from the network

    # a flipped byte inside another image's segment: that entry is dropped, the image
    # comes from storage, and it is exact
    e = local.lookup(damaged)
    path, start = _extent_entry(cache, local, e.record)
    plan = local.plan(damaged, VIEW)
    off, n = plan.segments[-1]
    raw = bytearray(path.read_bytes())
    raw[HEAD.size + off - start + n // 2] ^= 0x10
    path.write_bytes(bytes(raw))
    before = m.stats()
    assert read(m.mnt, VIEW, damaged) == local.read(damaged, VIEW)
    after = m.stats()
    assert after["disk_cache_discarded"] == before["disk_cache_discarded"] + 1
    assert after["remote_bytes"] > before["remote_bytes"] and after["checksum_failures"] == 0
    assert not path.exists()
