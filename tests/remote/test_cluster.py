"""Many nodes, one bucket (issue 20), through the kernel: two `--shard` mounts of one
s3:// dataset, each with its own memcached.  Counted, not timed: warm's GETs, where
every image came from (own disk tier, peer, storage), and what a dead or lying peer
costs (storage reads, never a wrong byte or an error)."""
import os

import pytest
from pymemcache.client.base import Client

import pcrfs
from pcrfs.cluster.node import record_counts
from pcrfs.cluster.shard import owners
from pcrfs.storage.peers import CHECK, MAC_SIZE, namespace, pieces, seal, unseal
from pcrfs.views.qk import plan
from remote.util import files_of, read, shuffled
from testkit.pages import CLEAN_PAGES, drop_page_cache
from testkit.servers import Memcached

from conftest import run_pcrfs

G = 10


@pytest.fixture
def peers(tmp_path):
    servers = []
    for i in range(2):
        m = Memcached(tmp_path / f"mc{i}")
        m.start()
        servers.append(m)
    yield servers
    for m in servers:
        m.stop()


@pytest.fixture
def cluster(s3env, s3_corpus, corpus_ds, mount, tmp_path, peers):
    local = pcrfs.open_dataset(str(corpus_ds))
    own = owners(record_counts(local), 2)
    peer_file = tmp_path / "peers"        # node 1 reads the list from a file
    peer_file.write_text("# node order\n" + "\n".join(m.address for m in peers) + "\n")
    lists = [",".join(m.address for m in peers), f"@{peer_file}"]
    nodes = [mount(s3_corpus, "--cache-dir", tmp_path / f"cache{i}", "--shard", f"{i}/2",
                   "--peers", lists[i], "--peer-bandwidth-limit", "1G", "--cache-size", "256k",
                   "-o", "fast_lane=no")
             for i in range(2)]
    assert [n.stats()["shard"]["peers"] for n in nodes][0] == \
        [n.stats()["shard"]["peers"] for n in nodes][1]
    return local, own, nodes




def owned_bytes(local, records, lo, hi):
    return sum(local.index.records[r][hi] - local.index.records[r][lo] for r in records)


def test_warm_gets_once_per_owned_record_then_only_missing_groups(cluster):
    local, own, (n0, _) = cluster
    mine = sorted(r for r, o in own.items() if o == 0)
    assert 0 < len(mine) < len(own)
    st = n0.stats()
    assert st["shard"]["owned_records"] == len(mine)
    before = st["remote_requests"]
    out = run_pcrfs("warm", n0.mnt, "--view", "q3", "-q").stdout
    st = n0.stats()
    w = st["shard"]["warm"]
    assert w["state"] == "done" and w["gets"] == len(mine) == st["warm_gets"]
    assert st["remote_requests"] - before == len(mine)          # one GET per owned record
    assert w["bytes"] == owned_bytes(local, mine, 0, 3)
    assert f"warmed {len(mine)} owned records at q3" in out
    # a higher k: one GET per record again, for the groups 4..G only
    run_pcrfs("warm", n0.mnt, "-q")
    w = n0.stats()["shard"]["warm"]
    assert w["gets"] == len(mine) and w["bytes"] == owned_bytes(local, mine, 3, G)
    # nothing missing: no GET, only republishing
    before = n0.stats()["remote_requests"]
    run_pcrfs("warm", n0.mnt, "--view", "q7", "-q")
    st = n0.stats()
    assert st["remote_requests"] == before and st["shard"]["warm"]["reused"] == len(mine)
    disk = st["cache_tiers"]["disk"]
    assert disk["policy"] == "shard" and disk["evicted"] == 0
    assert disk["bytes"] == owned_bytes(local, mine, 0, G) + 24 * len(mine)   # one entry each


def test_a_warm_after_memcached_restarts_publishes_again_and_a_dead_one_fails(cluster, peers):
    """The pool's connections die with a restarted memcached: the warm's set is retried on
    a new one, so the records held on disk are published again (an empty peer cache
    reported as published was the defect).  With memcached gone, the warm fails, names
    it, and exits 1."""
    local, own, (n0, _) = cluster
    mine = sorted(r for r, o in own.items() if o == 0)
    run_pcrfs("warm", n0.mnt, "--view", "q3", "-q")
    first = n0.stats()["shard"]["warm"]["published"]
    assert first > 0
    peers[0].stop()
    peers[0].start()
    rel = next(p for p in files_of(local, "q3") if own[local.lookup(p).record] == 0)
    e = local.lookup(rel)
    off, n = pieces(*plan(e, 3, local.index.records[e.record]).segments[0])[0]
    key = f"pcrfs:{namespace(str(local.uuid))}:{e.record}:{off}:{n}"
    client = Client(("127.0.0.1", peers[0].port))
    assert client.get(key) is None                        # the restart emptied it
    run_pcrfs("warm", n0.mnt, "--view", "q3", "-q")
    w = n0.stats()["shard"]["warm"]
    assert w["state"] == "done" and w["reused"] == len(mine) and w["published"] == first
    assert client.get(key) is not None
    peers[0].stop()
    r = run_pcrfs("warm", n0.mnt, "--view", "q3", "-q", check=False)
    w = n0.stats()["shard"]["warm"]
    assert r.returncode == 1 and w["state"] == "failed" and w["published"] == 0
    assert f"memcached {peers[0].address}" in r.stderr
    peers[0].start()


def test_a_warm_node_reads_every_image_from_its_disk_or_its_peer(cluster):
    local, own, nodes = cluster
    for n in nodes:
        run_pcrfs("warm", n.mnt, "-q")
    n0 = nodes[0]
    paths = files_of(local, "q10")
    mine = [p for p in paths if own[local.lookup(p).record] == 0]
    theirs = [p for p in paths if own[local.lookup(p).record] == 1]
    segs = sum(min(10, local.lookup(p).scans) for p in theirs)
    before = n0.stats()
    for rel in shuffled(paths):
        assert read(n0.mnt, "q10", rel) == local.read(rel, "q10")
    st = n0.stats()
    assert st["remote_requests"] == before["remote_requests"]       # storage untouched
    assert st["owned_hits"] - before["owned_hits"] == len(mine)
    assert st["peer_hits"] - before["peer_hits"] == segs
    assert st["peer_misses"] == before["peer_misses"] and st["peer_corrupt"] == 0
    # balance=storage (what the sampler writes): other nodes' records come from storage
    (n0.mnt / ".pcrfs/control/balance").write_text("storage\n")
    assert n0.stats()["shard"]["balance"] == "storage"
    drop_page_cache(CLEAN_PAGES)   # the kernel's copy of every file
    before = n0.stats()
    for rel in theirs[:3]:
        assert read(n0.mnt, "q10", rel) == local.read(rel, "q10")
    st = n0.stats()
    assert st["peer_hits"] == before["peer_hits"] and st["remote_requests"] > before["remote_requests"]
    with pytest.raises(OSError):
        (n0.mnt / ".pcrfs/control/balance").write_text("sideways\n")


def test_a_flipped_byte_in_a_peer_value_is_caught_and_read_from_storage(cluster, peers):
    local, own, (n0, n1) = cluster
    run_pcrfs("warm", n1.mnt, "-q")
    rel = next(p for p in files_of(local, "q10") if own[local.lookup(p).record] == 1)
    e = local.lookup(rel)
    off, n = pieces(*plan(e, 10, local.index.records[e.record]).segments[0])[0]
    key = f"pcrfs:{namespace(str(local.uuid))}:{e.record}:{off}:{n}"
    mc = Client(("127.0.0.1", peers[1].port))
    value = bytearray(mc.get(key))
    assert len(value) == n + CHECK.size
    value[CHECK.size + n // 2] ^= 0x40
    mc.set(key, bytes(value))
    before = n0.stats()
    assert read(n0.mnt, "q10", rel) == local.read(rel, "q10")
    st = n0.stats()
    assert st["peer_corrupt"] - before["peer_corrupt"] == 1
    assert st["remote_requests"] - before["remote_requests"] == 1   # that segment only
    assert st["checksum_failures"] == before["checksum_failures"]


def test_a_killed_peer_costs_storage_reads_never_an_error(cluster, peers):
    local, own, (n0, n1) = cluster
    run_pcrfs("warm", n1.mnt, "-q")
    theirs = [p for p in files_of(local, "q5") if own[local.lookup(p).record] == 1]
    peers[1].kill()
    before = n0.stats()
    for rel in theirs:
        assert read(n0.mnt, "q5", rel) == local.read(rel, "q5")
    st = n0.stats()
    assert st["peer_errors"] > before["peer_errors"]
    assert st["peer_hits"] == before["peer_hits"]
    assert st["remote_requests"] - before["remote_requests"] >= len(theirs)
    assert st["errors"] == before["errors"] and st["checksum_failures"] == 0
    assert any(not p["up"] for p in st["shard"]["peers"])


def test_the_sampler_and_the_daemon_agree_on_ownership(cluster):
    from torchvision.datasets import ImageFolder

    from pcrfs.torch import LocalityAwareBatchSampler
    local, own, (n0, _) = cluster
    run_pcrfs("warm", n0.mnt, "-q")
    ds = ImageFolder(str(n0.mnt / "q10"), loader=lambda p: p)
    s = LocalityAwareBatchSampler(ds, 4, num_replicas=2, rank=0, ranks_per_node=1)
    owned_by_sampler = [ds.samples[i][0] for i in range(len(ds)) if s.owner[i] == 0]
    assert (n0.mnt / ".pcrfs/control/balance").read_text() == "peer\n"   # the sampler's
    before = n0.stats()
    for path in owned_by_sampler:
        with open(path, "rb") as f:
            f.read()
    st = n0.stats()
    assert st["owned_hits"] - before["owned_hits"] == len(owned_by_sampler) > 0
    assert st["peer_hits"] == before["peer_hits"] and st["remote_requests"] == before["remote_requests"]


def test_bad_cluster_options_are_refused(s3env, s3_corpus, corpus_ds, tmp_path):
    mnt = tmp_path / "m"
    mnt.mkdir()
    for args, msg in ((["--shard", "2/2"], "need 0 <= i < p"),
                      (["--shard", "0/2", "--peers", "127.0.0.1:1"], "one per node"),
                      (["--peers", "127.0.0.1:1,127.0.0.1:2"], "needs --shard"),
                      (["--shard", "0/2", "--peers", "nohost"], "not host:port")):
        p = run_pcrfs("mount", s3_corpus, mnt, "--cache-dir", tmp_path / "c", *args, check=False)
        assert p.returncode != 0 and msg in p.stderr, p.stderr
        assert not os.path.ismount(mnt)
    p = run_pcrfs("mount", corpus_ds, mnt, "--shard", "0/2", check=False)
    assert p.returncode != 0 and "needs a remote dataset" in p.stderr


def _peer_value(local, own, peers, owner=1, nth=0):
    """(memcached client, key, rel) of the first piece of the nth image of owner's records."""
    rel = [p for p in files_of(local, "q10") if own[local.lookup(p).record] == owner][nth]
    e = local.lookup(rel)
    off, n = pieces(*plan(e, 10, local.index.records[e.record]).segments[0])[0]
    key = f"pcrfs:{namespace(str(local.uuid))}:{e.record}:{off}:{n}"
    return Client(("127.0.0.1", peers[owner].port)), key, rel


def test_a_poisoned_peer_value_sealed_again_is_a_counted_miss_not_eio(cluster, peers):
    """Bytes changed and the value's own XXH3 recomputed (what any writer of memcached
    can do): the index's checksum refuses it, the segment comes from storage, the file
    reads exact (issue 84: it gave EIO, where a counted miss is promised)."""
    local, own, (n0, n1) = cluster
    run_pcrfs("warm", n1.mnt, "-q")
    mc, key, rel = _peer_value(local, own, peers)
    payload = bytearray(mc.get(key)[CHECK.size:])
    payload[len(payload) // 2] ^= 0x40
    mc.set(key, seal(bytes(payload)))
    before = n0.stats()
    assert read(n0.mnt, "q10", rel) == local.read(rel, "q10")
    st = n0.stats()
    assert st["peer_corrupt"] - before["peer_corrupt"] == 1
    assert st["tier_damage_refetches"] - before["tier_damage_refetches"] == 1
    assert st["checksum_failures"] == before["checksum_failures"]


def test_with_a_peer_key_a_value_without_its_mac_is_refused(s3env, s3_corpus, corpus_ds,
                                                            mount, tmp_path, peers):
    """--peer-key: values carry a keyed BLAKE2b MAC.  Node 1 publishes with the key and
    node 0 reads them (peer hits); a value an attacker stored, the genuine bytes under a
    MAC of another key, or sealed the unkeyed way, is a counted miss read from storage."""
    local = pcrfs.open_dataset(str(corpus_ds))
    own = owners(record_counts(local), 2)
    key_file = tmp_path / "peer.key"
    key_file.write_bytes(os.urandom(32).hex().encode())
    key_file.chmod(0o644)
    lists = ",".join(m.address for m in peers)
    r = run_pcrfs("mount", s3_corpus, tmp_path / "x", "--cache-dir", tmp_path / "cx",
                  "--shard", "0/2", "--peers", lists, "--peer-key", key_file, check=False)
    assert r.returncode != 0 and "readable by others" in r.stderr
    key_file.chmod(0o600)
    nodes = [mount(s3_corpus, "--cache-dir", tmp_path / f"cache{i}", "--shard", f"{i}/2",
                   "--peers", lists, "--peer-key", key_file, "--cache-size", "256k",
                   "-o", "fast_lane=no") for i in range(2)]
    n0, n1 = nodes
    run_pcrfs("warm", n1.mnt, "-q")
    mc, key, rel = _peer_value(local, own, peers)
    genuine = mc.get(key)
    assert unseal(genuine, key_file.read_bytes(), key) == genuine[MAC_SIZE:]
    assert unseal(genuine) is None                     # not the unkeyed seal
    theirs = [p for p in files_of(local, "q10") if own[local.lookup(p).record] == 1]
    assert theirs[0] == rel
    before = n0.stats()
    for p in theirs[1:5]:
        assert read(n0.mnt, "q10", p) == local.read(p, "q10")
    assert n0.stats()["peer_hits"] > before["peer_hits"]            # keyed values verify
    # two forgeries, each of an image not read yet (a fetched segment may stay cached)
    for nth, forge in ((-1, lambda k, v: seal(v, b"another key of 16+ bytes", k)),
                       (-2, lambda k, v: seal(v))):
        mc, key, rel = _peer_value(local, own, peers, nth=nth)
        mc.set(key, forge(key, unseal(mc.get(key), key_file.read_bytes(), key)))
        before = n0.stats()
        assert read(n0.mnt, "q10", rel) == local.read(rel, "q10")
        st = n0.stats()
        assert st["peer_corrupt"] - before["peer_corrupt"] == 1
        assert st["remote_requests"] > before["remote_requests"]
