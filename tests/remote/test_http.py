"""Datasets behind a plain web server (nginx, Range requests), and the client's policy:
coalescing, the io-timeout bound on a dead server, secret-free messages."""
import os
import re
import shutil
import time
from pathlib import Path

import pytest

import pcrfs
from pcrfs.storage.objclient import ObjectClient, RemoteOptions, RemoteUnavailable
from pcrfs.storage.remote import coalesce
from remote.util import files_to_read, in_record_order, one_view_of_each_kind, read, same_as_local, shuffled
from testkit.servers import FlakyProxy, Nginx, free_ports

from conftest import run_pcrfs


@pytest.fixture(scope="module")
def nginx(corpus_ds, tmp_path_factory):
    """nginx serving the directory that holds corpus_ds (as `ds`)."""
    n = Nginx(corpus_ds.parent, tmp_path_factory.mktemp("nginx"))
    n.start()
    yield n
    n.stop()


def test_http_dataset_serves_each_kind_of_view(nginx, corpus_ds, mount, tmp_path):
    url = f"{nginx.url}/{corpus_ds.name}"
    local = pcrfs.open_dataset(str(corpus_ds))
    m = mount(url, "--cache-dir", tmp_path / "cache")
    views = one_view_of_each_kind(local)
    assert len(views) == 4
    for view, rel in files_to_read(local, views):
        assert same_as_local(read(m.mnt, view, rel), local, view, rel), (view, rel)
    log = [line for line in nginx.requests() if "/records/" in line and ".pcr" in line]
    assert log and all('" 206 ' in line for line in log)   # ranges only, never a whole record
    st = m.stats()
    assert st["remote_requests"] >= len(log) and st["checksum_failures"] == 0
    # docs/REMOTE.md lists the remote counters: each is in stats.json
    doc = (Path(__file__).parents[2] / "docs" / "REMOTE.md").read_text()
    listed = re.findall(r"`(\w+)`", doc.split("- Stats (")[1].split("\n\n")[0])
    assert len(listed) >= 9 and not set(listed) - set(st), set(listed) - set(st)


def test_http_random_reads_fetch_only_their_segments(nginx, corpus_ds, mount, tmp_path):
    url = f"{nginx.url}/{corpus_ds.name}"
    local = pcrfs.open_dataset(str(corpus_ds))
    m = mount(url, "--cache-dir", tmp_path / "cache", "--cache-size", "256k")
    before = m.stats()
    paths = shuffled(in_record_order(local, "q3"), 9)[:40]
    for rel in paths:
        assert read(m.mnt, "q3", rel) == local.read(rel, "q3")
    st = m.stats()
    assert st["remote_bytes"] - before["remote_bytes"] == st["served_bytes"]["q3"] - 2 * len(paths)


def test_http_missing_dataset_is_a_clear_error(nginx, tmp_path):
    (tmp_path / "m").mkdir()
    r = run_pcrfs("mount", f"{nginx.url}/nothing-here", tmp_path / "m", "--cache-dir",
                  tmp_path / "c", check=False)
    assert r.returncode == 2
    assert f"{nginx.url}/nothing-here/manifest.json does not exist" in r.stderr


def test_dead_server_fails_within_io_timeout_after_retries():
    (port,) = free_ports(1)
    c = ObjectClient(f"http://127.0.0.1:{port}/ds", RemoteOptions(io_timeout=3))
    t = time.monotonic()
    with pytest.raises(RemoteUnavailable, match="gave up after .* attempts"):
        c.get_ranges("records/r000000.pcr", [(0, 100)])
    took = time.monotonic() - t
    # the deadline, not the clock, is what is checked: retries stop once io_timeout is
    # spent (a few attempts, then one error); the wall bound only catches a hang
    assert c.stats.remote_retries >= 2 and c.stats.remote_errors == 1
    assert took <= 3 * 3.0, took


def test_messages_carry_no_credentials(monkeypatch):
    secret = "sEcReT-value-that-must-not-leak"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEKEYID0000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    (port,) = free_ports(1)
    c = ObjectClient("s3://bucket/prefix", RemoteOptions(endpoint=f"http://127.0.0.1:{port}",
                                                         io_timeout=1))
    with pytest.raises(RemoteUnavailable) as e:
        c.get("manifest.json")
    text = str(e.value) + repr(e.value)
    assert "s3://bucket/prefix/manifest.json" in text
    assert secret not in text and "AKIAEXAMPLEKEYID0000" not in text


def test_coalesce_merges_touching_ranges_only():
    assert coalesce([(10, 20), (0, 10), (30, 40), (40, 41), (50, 50)]) == [(0, 20), (30, 41), (50, 50)]
    assert coalesce([(0, 10), (5, 8)]) == [(0, 10)]
    assert coalesce([]) == []


def test_url_forms_are_checked():
    with pytest.raises(pcrfs.errors.PcrfsError, match="no bucket"):
        ObjectClient("s3:///prefix")
    with pytest.raises(pcrfs.errors.PcrfsError, match="io-timeout"):
        ObjectClient("s3://b/p", RemoteOptions(io_timeout=0))


@pytest.mark.parametrize("status", [503, 429])
def test_throttling_and_5xx_are_retried(nginx, corpus_ds, mount, tmp_path, status):
    """Every third request refused (503 Slow Down / 429): every read still succeeds,
    exactly, after jittered retries."""
    proxy = FlakyProxy(nginx.url, every=3, status=status)
    try:
        local = pcrfs.open_dataset(str(corpus_ds))
        m = mount(f"{proxy.url}/{corpus_ds.name}", "--cache-dir", tmp_path / "cache",
                  "--io-timeout", "20")
        for rel in shuffled(in_record_order(local, "q4"), 2)[:24]:
            assert read(m.mnt, "q4", rel) == local.read(rel, "q4")
        st = m.stats()
        assert proxy.failed > 5 and st["remote_retries"] >= proxy.failed - 2   # mount: index
        assert st["remote_errors"] == 0 and st["checksum_failures"] == 0
    finally:
        proxy.stop()


def test_optional_metadata_the_store_fails_to_serve_fails_the_mount(nginx, corpus_ds,
                                                                     tmp_path):
    """raw.json and liquid.json are optional, and their absence (404) is normal; a store
    that answers 503 for one until --io-timeout is not absence: the mount refuses, naming
    the object, instead of serving mix/ and raw/ with defaults and no word."""
    proxy = FlakyProxy(nginx.url, every=10**9, status=503, always=("/raw.json",))
    try:
        (tmp_path / "m").mkdir()
        r = run_pcrfs("mount", f"{proxy.url}/{corpus_ds.name}", tmp_path / "m", "--cache-dir",
                      tmp_path / "c", "--io-timeout", "3", check=False)
        assert r.returncode != 0 and not os.path.ismount(tmp_path / "m")
        assert "raw.json" in r.stderr and "503" in r.stderr, r.stderr
        assert proxy.failed >= 1
    finally:
        proxy.stop()


def test_hung_server_fails_within_io_timeout():
    """A server that accepts and never answers (a hung node): attempts time out at a
    third of --io-timeout, and the call gives up within it."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    try:
        c = ObjectClient(f"http://127.0.0.1:{s.getsockname()[1]}/ds", RemoteOptions(io_timeout=3))
        t = time.monotonic()
        with pytest.raises(RemoteUnavailable, match="timed out; gave up"):
            c.get_ranges("records/r000000.pcr", [(0, 100), (200, 300)])
        # attempts of a third of io_timeout each: at most 3 before the deadline (the wall
        # bound only catches a hang, with room for a loaded machine)
        assert 1 <= c.stats.remote_retries + 1 <= 3, c.stats.remote_retries
        assert time.monotonic() - t <= 3 * 3.0
    finally:
        s.close()


def test_download_in_ranged_chunks(nginx, corpus_ds, tmp_path):
    c = ObjectClient(f"{nginx.url}/{corpus_ds.name}")
    want = (corpus_ds / "index.lmdb" / "data.mdb").read_bytes()
    n = c.download("index.lmdb/data.mdb", str(tmp_path / "x"), chunk=10_000)
    assert n == len(want) and (tmp_path / "x").read_bytes() == want
    assert c.stats.remote_requests == 1 + -(-len(want) // 10_000)     # HEAD + the chunks


def test_https_with_a_private_ca(corpus_ds, mount, tmp_path, monkeypatch):
    """https:// through nginx with a self-signed certificate: refused until AWS_CA_BUNDLE
    names it, then served exactly."""
    n = Nginx(corpus_ds.parent, tmp_path / "nginx-tls", tls=True)
    n.start()
    try:
        url = f"{n.url}/{corpus_ds.name}"
        monkeypatch.delenv("AWS_CA_BUNDLE", raising=False)
        (tmp_path / "m").mkdir()
        r = run_pcrfs("mount", url, tmp_path / "m", "--cache-dir", tmp_path / "c",
                      "--io-timeout", "2", check=False)
        assert r.returncode == 2 and f"{url}/manifest.json" in r.stderr
        assert "certificate is not trusted" in r.stderr
        monkeypatch.setenv("AWS_CA_BUNDLE", str(n.cert))
        local = pcrfs.open_dataset(str(corpus_ds))
        m = mount(url, "--cache-dir", tmp_path / "c")
        for rel in in_record_order(local, "q5")[:30]:
            assert read(m.mnt, "q5", rel) == local.read(rel, "q5")
    finally:
        n.stop()


def test_push_and_build_refuse_http_urls(small_src, corpus_ds):
    r = run_pcrfs("push", corpus_ds, "http://127.0.0.1:1/ds", check=False)
    assert r.returncode == 2 and "push uploads to s3://" in r.stderr
    r = run_pcrfs("build", small_src, "https://example.org/ds", check=False)
    assert r.returncode == 2 and "http(s):// is read-only" in r.stderr


def test_disk_cache_background_writes_are_served_pending_and_flushed_on_close(tmp_path):
    from pcrfs.storage.diskcache import DiskCache
    c = DiskCache(str(tmp_path / "c"), 1 << 20)
    blobs = {f"k{i}": bytes([i]) * 5000 for i in range(50)}
    for k, v in blobs.items():
        c.put_later(k, v)
    for k, v in blobs.items():             # pending or written: either way served exactly
        assert c.contains(k) and c.get(k) == v
    c.close()
    c.put_later("late", b"x" * 10)         # after close: dropped, never half-written
    assert not c.contains("late")
    again = DiskCache(str(tmp_path / "c"), 1 << 20)
    assert all(again.get(k) == v for k, v in blobs.items())
    assert not [p for p in (tmp_path / "c").iterdir() if p.name.endswith(".tmp")]


def test_a_damaged_remote_index_is_refused_at_mount(nginx, corpus_ds, tmp_path):
    bad = corpus_ds.parent / "ds-bad-index"
    if not bad.exists():
        shutil.copytree(corpus_ds, bad)
        idx = bad / "index.lmdb" / "data.mdb"
        idx.write_bytes(idx.read_bytes()[:4096])
    (tmp_path / "m").mkdir()
    r = run_pcrfs("mount", f"{nginx.url}/{bad.name}", tmp_path / "m", "--cache-dir",
                  tmp_path / "c", check=False)
    # the manifest's size and checksum of the index, checked before LMDB maps it
    assert r.returncode == 2 and "index.lmdb/data.mdb" in r.stderr \
        and "does not match the manifest's checksum" in r.stderr
    assert "Traceback" not in r.stderr and not os.path.ismount(tmp_path / "m")
    assert not list((tmp_path / "c").rglob("data.mdb"))      # nothing half-downloaded kept
