"""Datasets on a real S3 server (SeaweedFS), mounted through the real kernel path."""
import errno
import json
import os
import random
import shutil
import threading
import time

import pytest

import pcrfs
from pcrfs.storage.reader import SEQUENTIAL_RUN
from pcrfs.storage.remote import MUTABLE_META
from remote.conftest import BUCKET
from remote.util import (
    DERIVED,
    every_file,
    files_of,
    files_to_read,
    in_record_order,
    killed_then_restarted,
    read,
    read_view,
    same_as_local,
    shuffled,
)
from testkit.servers import SECRET_KEY

from conftest import run_pcrfs


def test_build_into_s3_mount_and_read_every_file(s3env, corpus_part_src, corpus_part_ds, mount,
                                                 tmp_path):
    """`pcrfs build SRC s3://...` then mount: every file of every view (of l3 and raw, one
    per record), through the kernel, equals open_dataset on a local build of the same
    tree; every file's size does."""
    url = f"s3://{BUCKET}/built"
    tmp = tmp_path / "buildtmp"
    tmp.mkdir()
    out = run_pcrfs("build", corpus_part_src, url, "--images-per-record", 16, "-q", "--tmp-dir", tmp)
    assert f"built {url}" in out.stdout
    assert list(tmp.iterdir()) == []               # the index's local temporary is gone
    local = pcrfs.open_dataset(str(corpus_part_ds))
    m = mount(url, "--cache-dir", tmp_path / "cache")
    for view, rel in every_file(local):
        p = os.path.join(os.fsencode(m.mnt), view.encode(), rel)
        assert os.stat(p).st_size == local.file_size(rel, view)
    reads = files_to_read(local)
    for view, rel in reads:
        assert same_as_local(read(m.mnt, view, rel), local, view, rel), (view, rel)
    records = local.manifest["records"]
    assert len(reads) == (len(local.all_views) - len(DERIVED)) * local.manifest["images"] \
        + len(DERIVED) * records
    st = m.stats()
    assert st["remote_requests"] > 0 and st["checksum_failures"] == 0 and st["source"] == url
    info = run_pcrfs("info", url, "--json")
    assert json.loads(info.stdout)["images"] == local.manifest["images"]


def test_read_amplification_and_requests_per_image(s3env, s3_corpus, corpus_ds, mount, tmp_path):
    """Record order: one extent GET per record once the run is detected, so at most one
    GET per image.  Random order: exactly the k segments, one GET each.  (This dataset has
    7 records of 16 images: a shuffled reader meets each record every few opens and may
    trigger extents by chance, so the random pass gets a cache too small for extents;
    `make bench` measures random order on many large records with the normal cache.)"""
    local = pcrfs.open_dataset(str(corpus_ds))
    for order in ("record", "random"):
        m = mount(s3_corpus, "--cache-dir", tmp_path / f"cache-{order}",
                  *(["--cache-size", "256k"] if order == "random" else []))
        r = read_view(m, local, "q2", "random" if order == "random" else "record")
        paths, st, gets, fetched, payload = (r[k] for k in ("paths", "stats", "gets", "fetched",
                                                            "payload"))
        segments = sum(len(local.plan(p, "q2").segments) for p in paths)
        if order == "random":   # exactly the segments, one GET each (never adjacent here)
            assert fetched == payload and gets == segments, (fetched, payload, gets, segments)
        else:                   # the detection run's images are fetched again in the extent
            ipr = local.manifest["build"]["images_per_record"]
            assert st["extent_fetches"] == local.manifest["records"]
            assert gets <= len(paths)
            assert payload <= fetched <= payload * (1 + (SEQUENTIAL_RUN - 1) / ipr) * 1.1


def test_push_resumes_refuses_foreign_overwrites_and_publishes_manifest_last(
        s3env, corpus_ds, edge_ds, mount, tmp_path, monkeypatch):
    from pcrfs.admin.push import push
    from pcrfs.storage.objclient import ObjectClient, RemoteNotFound, RemoteOptions
    url = f"s3://{BUCKET}/pushed"
    opts = RemoteOptions(endpoint=s3env.endpoint)
    real_put = ObjectClient.put_file
    calls = []

    def failing_put(self, key, path):  # the network dies after two records went up
        calls.append(key)
        if len(calls) > 2:
            raise pcrfs.storage.objclient.RemoteUnavailable("PUT: connection failed")
        return real_put(self, key, path)
    monkeypatch.setattr(ObjectClient, "put_file", failing_put)
    with pytest.raises(pcrfs.errors.PcrfsError, match="not published"):
        push(str(corpus_ds), url, opts, jobs=1, progress=False)
    monkeypatch.setattr(ObjectClient, "put_file", real_put)
    client = ObjectClient(url, opts)
    with pytest.raises(RemoteNotFound):
        client.get("manifest.json")           # half a dataset is not a dataset
    (tmp_path / "m0").mkdir()
    r = run_pcrfs("mount", url, tmp_path / "m0", "--cache-dir", tmp_path / "c", check=False)
    assert r.returncode == 2 and "manifest.json does not exist" in r.stderr
    out = run_pcrfs("push", corpus_ds, url, "-q").stdout
    assert "2 already there" in out               # resumed
    out = run_pcrfs("push", corpus_ds, url, "-q").stdout
    assert " 0 objects" in out                    # nothing new
    r = run_pcrfs("push", edge_ds, url, "-q", check=False)
    assert r.returncode == 2 and "another dataset" in r.stderr and "--overwrite" in r.stderr
    # what the replaced dataset gained after its build (tune, materialize, info --quality)
    # and every other object of format/'s table: the fast lane's segment table too
    from pcrfs.format import AFTER_BUILD_META, SEGTAB
    for key in (*AFTER_BUILD_META, SEGTAB):
        client.put_bytes(key, b'{"dataset": "the old one"}')
    run_pcrfs("push", edge_ds, url, "-q", "--overwrite")
    keys = {k for k, _ in client.list()}
    assert SEGTAB not in keys                 # (push never uploads it: mounts derive it)
    for key in AFTER_BUILD_META:              # not inherited
        if (edge_ds / key).exists():
            assert client.get(key) == (edge_ds / key).read_bytes(), key
        else:
            assert key not in keys, key
    edge = pcrfs.open_dataset(str(edge_ds))
    assert {k for k in keys if k.endswith(".pcr")} == {
        f"records/r{i:06d}.pcr" for i in range(edge.manifest["records"])}   # stale removed
    assert "push-in-progress.json" not in keys
    m = mount(url, "--cache-dir", tmp_path / "c")
    for view, rel in every_file(edge)[:200]:
        assert read(m.mnt, view, rel) == edge.read(rel, view)


def test_mount_errors_name_bucket_and_key(s3env, s3_corpus, tmp_path, monkeypatch):
    mnt = tmp_path / "m"
    mnt.mkdir()
    r = run_pcrfs("mount", f"s3://{BUCKET}/no/such/prefix", mnt, "--cache-dir", tmp_path / "c",
                  check=False)
    assert r.returncode == 2
    assert f"s3://{BUCKET}/no/such/prefix/manifest.json does not exist" in r.stderr
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-0123456789")
    r = run_pcrfs("mount", s3_corpus, mnt, "--cache-dir", tmp_path / "c", check=False)
    assert r.returncode == 2
    assert f"{s3_corpus}/manifest.json: access denied (HTTP 403)" in r.stderr
    assert "wrong-secret" not in r.stderr
    r = run_pcrfs("mount", "s3://no-such-bucket-pcrfs/x", mnt, "--cache-dir", tmp_path / "c",
                  check=False)
    assert r.returncode == 2 and "s3://no-such-bucket-pcrfs/x/manifest.json" in r.stderr
    assert not os.path.ismount(mnt)


def test_credentials_from_aws_profile_files(seaweed, s3_corpus, tmp_path, monkeypatch):
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    env = seaweed.env()
    creds = tmp_path / "credentials"
    creds.write_text(f"[default]\naws_access_key_id = nobody\naws_secret_access_key = x\n\n"
                     f"[train]\naws_access_key_id = {env['AWS_ACCESS_KEY_ID']}\n"
                     f"aws_secret_access_key = {env['AWS_SECRET_ACCESS_KEY']}\n")
    config = tmp_path / "config"
    config.write_text(f"[profile train]\nregion = us-east-1\nendpoint_url = {seaweed.endpoint}\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_PROFILE", "train")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    info = json.loads(run_pcrfs("info", s3_corpus, "--json").stdout)
    assert info["images"] > 0
    monkeypatch.setenv("AWS_PROFILE", "default")   # wrong keys: refused, clearly
    r = run_pcrfs("info", s3_corpus, "--endpoint", seaweed.endpoint, check=False)
    assert r.returncode == 2 and "access denied" in r.stderr


def test_two_mounts_read_concurrently(s3env, s3_corpus, corpus_ds, mount, tmp_path):
    """Two daemons (two nodes) on one bucket, each with its own cache: no mismatch."""
    local = pcrfs.open_dataset(str(corpus_ds))
    files = [(v, p) for v, p in every_file(local) if v != "l3"]
    expected = {}
    bound = 256 * 1024     # node 1's disk cache holds a small part of what it reads
    mounts = [mount(s3_corpus, "--cache-dir", tmp_path / f"node{i}", "--cache-size", "8M",
                    *(["--cache-dir-size", str(bound)] if i else []))
              for i in range(2)]
    mismatches, reads, errors = [], [0], []
    stop = time.monotonic() + 12     # about 600 reads here

    def reader(m, seed):
        rnd = random.Random(seed)
        while time.monotonic() < stop:
            v, p = rnd.choice(files)
            try:
                data = read(m.mnt, v, p)
            except OSError as e:
                errors.append((v, p, e))
                continue
            want = expected.get((v, p))
            if want is None:
                want = expected.setdefault((v, p), local.read(p, v))
            if data != want:
                mismatches.append((v, p))
            reads[0] += 1
    threads = [threading.Thread(target=reader, args=(mounts[i % 2], i)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not mismatches and not errors
    assert reads[0] > 200, reads
    for m in mounts:
        assert m.stats()["remote_bytes"] > 0
    st = mounts[1].stats()
    on_disk = sum(f.stat().st_size for f in (tmp_path / "node1" / str(local.uuid) / "records").iterdir())
    assert st["disk_cache_capacity"] == bound and on_disk <= bound and st["disk_cache_bytes"] <= bound
    assert st["remote_bytes"] > 4 * bound     # it fetched far more than it could keep


def test_export_and_info_read_a_remote_dataset(s3env, s3_corpus, corpus_ds, tmp_path):
    local = pcrfs.open_dataset(str(corpus_ds))
    out = run_pcrfs("export", s3_corpus, "q1", tmp_path / "out")
    assert f"exported {local.manifest['images']} files" in out.stdout
    for rel in files_of(local, "q1"):
        assert (tmp_path / "out" / os.fsdecode(rel)).read_bytes() == local.read(rel, "q1")
    text = run_pcrfs("info", s3_corpus).stdout
    assert f"dataset     {s3_corpus}" in text and str(local.uuid) in text


def test_disk_cache_survives_remount_and_corrupt_entries_are_refetched(
        s3env, s3_corpus, corpus_ds, mount, tmp_path):
    local = pcrfs.open_dataset(str(corpus_ds))
    cache = tmp_path / "cache"
    q5 = in_record_order(local, "q5")
    q2 = shuffled(in_record_order(local, "q2"), 3)

    def epoch(m):
        for rel in q5:
            assert read(m.mnt, "q5", rel) == local.read(rel, "q5")
        for rel in q2:
            assert read(m.mnt, "q2", rel) == local.read(rel, "q2")
        return m.stats()
    with pcrfs_mount(mount, s3_corpus, cache) as m:
        cold = epoch(m)
    assert cold["remote_bytes"] > 0
    with pcrfs_mount(mount, s3_corpus, cache) as m:
        warm = epoch(m)
    # the manifest and the files that may change under one uuid; index and data cached
    assert warm["remote_requests"] == 1 + len(MUTABLE_META)
    assert warm["disk_cache_hits"] > 0
    entries = sorted((cache / str(local.uuid) / "records").iterdir())
    assert len(entries) > 10
    for i, f in enumerate(entries):                     # bit rot and torn writes
        raw = bytearray(f.read_bytes())
        if i % 2:
            raw[len(raw) // 2] ^= 0x40
            f.write_bytes(bytes(raw))
        else:
            f.write_bytes(bytes(raw[: len(raw) // 2]))
    with pcrfs_mount(mount, s3_corpus, cache) as m:
        after = epoch(m)
    assert after["disk_cache_discarded"] > 0 and after["checksum_failures"] == 0
    assert after["remote_bytes"] > 0                    # refetched, then served correctly


class pcrfs_mount:  # noqa: N801 - a context manager used like a function
    """A mount that is unmounted at the end of the with-block (the fixture's teardown
    is too late for remount tests)."""

    def __init__(self, mount, url, cache):
        self.m = mount(url, "--cache-dir", cache)

    def __enter__(self):
        return self.m

    def __exit__(self, *exc):
        self.m.__exit__(None, None, None)


def test_partial_record_object_is_eio_not_garbage(s3env, corpus_ds, mount, tmp_path):
    """A record object cut short at the server: its images are EIO, the rest exact."""
    from pcrfs.storage.objclient import ObjectClient, RemoteOptions
    url = f"s3://{BUCKET}/cut"
    run_pcrfs("push", corpus_ds, url, "-q")
    client = ObjectClient(url, RemoteOptions(endpoint=s3env.endpoint))
    rec = (corpus_ds / "records" / "r000001.pcr").read_bytes()
    client.put_bytes("records/r000001.pcr", rec[: len(rec) * 2 // 3])
    local = pcrfs.open_dataset(str(corpus_ds))
    m = mount(url, "--cache-dir", tmp_path / "c", "--io-timeout", "5")
    bad = good = 0
    view = local.views[-1]
    for rel in files_of(local, view):
        e = local.lookup(rel)
        try:
            data = read(m.mnt, view, rel)
        except OSError as err:
            assert err.errno == errno.EIO and e.record == 1
            bad += 1
            continue
        assert same_as_local(data, local, view, rel)
        good += 1
    assert bad > 0 and good > 0
    assert m.stats()["errors"].get("EIO", 0) >= bad
    shutil.rmtree(tmp_path / "c", ignore_errors=True)


def test_bandwidth_limit_applies_to_remote_bytes_and_status_shows_them(s3env, s3_corpus, corpus_ds,
                                                                         mount, tmp_path):
    local = pcrfs.open_dataset(str(corpus_ds))
    rate = 256 * 1024
    m = mount(s3_corpus, "--cache-dir", tmp_path / "c", "--bandwidth-limit", "256k",
              "--cache-size", "256k")
    before = m.stats()["remote_bytes"]
    t = time.monotonic()
    for rel in shuffled(files_of(local, "q2"), 4)[:30]:     # about 3 MB: 12 s at the rate
        read(m.mnt, "q2", rel)
    elapsed = time.monotonic() - t
    fetched = m.stats()["remote_bytes"] - before
    assert fetched > 4 * rate * 0.05
    assert elapsed >= (fetched - 0.05 * rate) / rate * 0.95   # a 50 ms burst, then the rate
    out = run_pcrfs("status", m.mnt).stdout
    assert f"source      {s3_corpus}" in out and "disk cache" in out and "requests" in out

def test_a_dead_store_fails_within_io_timeout_behind_a_bandwidth_queue(s3env):
    """The bandwidth limit is charged for bytes that arrived: a read of a store that is down
    (nothing listens) fails within --io-timeout even when the limit's queue holds 20 s of
    other reads' bytes, instead of waiting out the queue first."""
    from pcrfs.errors import CorruptDataError
    from pcrfs.storage.objclient import ObjectClient, RemoteOptions
    from pcrfs.storage.remote import RemoteStorage
    from pcrfs.storage.throttle import TokenBucket
    from pcrfs.telemetry.stats import Stats
    from testkit.servers import free_ports

    (port,) = free_ports(1)
    io_timeout = 1.5
    stats = Stats()
    client = ObjectClient(f"s3://{BUCKET}/corpus",
                          RemoteOptions(endpoint=f"http://127.0.0.1:{port}", io_timeout=io_timeout),
                          stats)
    bucket = TokenBucket(64 * 1024)
    queued = threading.Thread(target=bucket.consume, args=(20 * 64 * 1024,), daemon=True)
    queued.start()      # another reader's 20 s of bytes, ahead in the queue
    storage = RemoteStorage(client, None, stats, bucket)
    t = time.monotonic()
    with pytest.raises(CorruptDataError, match="r000000.pcr"):
        storage.pread(0, 0, 4096)
    took = time.monotonic() - t
    assert took < io_timeout + 2, f"failed after {took:.1f} s with --io-timeout {io_timeout}"
    assert stats.snapshot()["remote_errors"] == 1


def test_server_killed_then_restarted(seaweed, s3env, s3_corpus, corpus_ds, mount, tmp_path):
    """In-flight reads fail with EIO within --io-timeout, never wrong bytes; after the
    server returns, reads recover without a remount.  The secret never reaches the log."""
    local = pcrfs.open_dataset(str(corpus_ds))
    io_timeout = 6.0
    log = tmp_path / "daemon.log"
    m = mount(s3_corpus, "--cache-dir", tmp_path / "cache", "--cache-size", "4M",
              "--io-timeout", io_timeout, "--bandwidth-limit", "4M", "--log", log, "--debug")
    st = killed_then_restarted(m, local, seaweed, io_timeout)
    assert st["remote_retries"] > 0 and st["remote_errors"] > 0
    text = log.read_text() + json.dumps(st)
    assert "retry" in text and SECRET_KEY not in text


def test_more_records_than_descriptors_remote(s3env, many_records_ds, mount, tmp_path):
    """1,300 records from S3 under RLIMIT_NOFILE 64: every q1, qG and l3 file, first
    fetched, then again from the disk cache after a remount."""
    from conftest import read_everything_under_limit
    url = f"s3://{BUCKET}/many-records"
    run_pcrfs("push", many_records_ds, url, "-q", "--jobs", 8)
    cache = tmp_path / "cache"
    views = ["q1", "q10", "l3"]
    for rnd in ("fetched", "disk cache"):
        m = mount(url, "--cache-dir", cache, nofile=64, mnt=tmp_path / f"mnt-{rnd[0]}")
        out = read_everything_under_limit(m.mnt, many_records_ds, views, m.pid, 64)
        assert out["files"] == 3 * 1300
        st = m.stats()
        assert st.get("errors", {}) == {}, (rnd, st.get("errors"))
        if rnd == "disk cache":
            assert st["disk_cache_hits"] >= 2 * 1300 and st["remote_requests"] < 100, st
        m.__exit__(None, None, None)
