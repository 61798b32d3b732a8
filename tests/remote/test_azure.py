"""Datasets in Azure Blob Storage (az://), served by a real Azurite, mounted through the
kernel: the same guarantees as s3:// (manifest last, ranged reads, disk cache, retries
within --io-timeout, clear 403/404 messages, credentials never logged)."""
import errno
import json
import os
import urllib.request

import pytest

import pcrfs
from remote.conftest import CONTAINER
from remote.util import (
    DERIVED,
    every_file,
    files_of,
    files_to_read,
    killed_then_restarted,
    one_view_of_each_kind,
    read,
    read_view,
    same_as_local,
)
from testkit.servers import AZURITE_KEY, free_ports

from conftest import run_pcrfs


def test_build_into_azure_mount_read_each_kind_of_view_and_verify(azenv, corpus_part_src,
                                                                 corpus_part_ds, mount, tmp_path):
    url = f"az://{CONTAINER}/built"
    out = run_pcrfs("build", corpus_part_src, url, "--images-per-record", 16, "-q")
    assert f"built {url}" in out.stdout
    local = pcrfs.open_dataset(str(corpus_part_ds))
    (port,) = free_ports(1)
    log = tmp_path / "daemon.log"
    m = mount(url, "--cache-dir", tmp_path / "cache", "--log", log, "-o", f"metrics={port}")
    for view, rel in every_file(local):
        p = os.path.join(os.fsencode(m.mnt), view.encode(), rel)
        assert os.stat(p).st_size == local.file_size(rel, view)
    views = one_view_of_each_kind(local)
    reads = files_to_read(local, views)
    for view, rel in reads:
        assert same_as_local(read(m.mnt, view, rel), local, view, rel), (view, rel)
    derived = sum(v in DERIVED for v in views)      # one file per record of these
    assert len(reads) == (len(views) - derived) * local.manifest["images"] \
        + derived * local.manifest["records"]
    st = m.stats()
    assert st["remote_requests"] > 0 and st["checksum_failures"] == 0 and st["source"] == url
    assert json.loads(run_pcrfs("info", url, "--json").stdout)["images"] == local.manifest["images"]
    out = run_pcrfs("verify", url, "-q").stdout
    assert out.rstrip().endswith("OK")
    # the account key reaches neither the metrics nor the log
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    assert f'source="{url}"' in text and "pcrfs_remote_received_bytes_total" in text
    assert AZURITE_KEY not in text + log.read_text() and "AccountKey" not in text
    # a second mount on the same cache dir: every image from disk, no GET
    m.__exit__(None, None, None)
    m2 = mount(url, "--cache-dir", tmp_path / "cache")
    before = m2.stats()["remote_requests"]
    q3 = files_of(local, "q3")
    for rel in q3:
        assert read(m2.mnt, "q3", rel) == local.read(rel, "q3")
    st = m2.stats()
    assert st["remote_requests"] == before and st["disk_cache_hits"] > 0


def test_ranged_reads_fetch_only_the_segments(azenv, az_corpus, corpus_ds, mount, tmp_path):
    """Random order: exactly the k segments, one ranged GET each; record order: at most
    one GET per image (extents)."""
    local = pcrfs.open_dataset(str(corpus_ds))
    for order in ("record", "random"):
        m = mount(az_corpus, "--cache-dir", tmp_path / f"cache-{order}",
                  *(["--cache-size", "256k"] if order == "random" else []))
        r = read_view(m, local, "q2", "random" if order == "random" else "record")
        paths, st, gets, fetched, payload = (r[k] for k in ("paths", "stats", "gets", "fetched",
                                                            "payload"))
        if order == "random":
            segments = sum(len(local.plan(p, "q2").segments) for p in paths)
            assert fetched == payload and gets == segments, (fetched, payload, gets, segments)
        else:
            assert st["extent_fetches"] == local.manifest["records"] and gets <= len(paths)


def test_push_resumes_and_publishes_the_manifest_last(azenv, corpus_ds, mount, tmp_path,
                                                      monkeypatch):
    from pcrfs.admin.push import push
    from pcrfs.storage.objclient import ObjectClient, RemoteNotFound, RemoteUnavailable
    url = f"az://{CONTAINER}/pushed"
    real_put = ObjectClient.put_file
    calls = []

    def failing_put(self, key, path):   # the network dies after two records went up
        calls.append(key)
        if len(calls) > 2:
            raise RemoteUnavailable("PUT: connection failed")
        return real_put(self, key, path)
    monkeypatch.setattr(ObjectClient, "put_file", failing_put)
    with pytest.raises(pcrfs.errors.PcrfsError, match="not published"):
        push(str(corpus_ds), url, jobs=1, progress=False)
    monkeypatch.setattr(ObjectClient, "put_file", real_put)
    with pytest.raises(RemoteNotFound):
        ObjectClient(url).get("manifest.json")        # half a dataset is not a dataset
    (tmp_path / "m0").mkdir()
    r = run_pcrfs("mount", url, tmp_path / "m0", "--cache-dir", tmp_path / "c", check=False)
    assert r.returncode == 2 and "manifest.json does not exist" in r.stderr
    assert "2 already there" in run_pcrfs("push", corpus_ds, url, "-q").stdout   # resumed
    local = pcrfs.open_dataset(str(corpus_ds))
    m = mount(url, "--cache-dir", tmp_path / "c")
    for view, rel in every_file(local)[::7]:
        assert same_as_local(read(m.mnt, view, rel), local, view, rel)


def test_errors_name_container_and_key(azenv, az_corpus, tmp_path, monkeypatch):
    mnt = tmp_path / "m"
    mnt.mkdir()
    r = run_pcrfs("mount", f"az://{CONTAINER}/no/such/prefix", mnt, "--cache-dir", tmp_path / "c",
                  check=False)
    assert r.returncode == 2
    assert f"az://{CONTAINER}/no/such/prefix/manifest.json does not exist" in r.stderr
    r = run_pcrfs("info", "az://no-such-container/x", check=False)
    assert r.returncode == 2 and "az://no-such-container/x/manifest.json" in r.stderr
    wrong = azenv.connection_string().replace(AZURITE_KEY, "d3Jvbmcta2V5LXdyb25nLWtleQ==")
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", wrong)
    r = run_pcrfs("mount", az_corpus, mnt, "--cache-dir", tmp_path / "c", check=False)
    assert r.returncode == 2
    assert f"{az_corpus}/manifest.json: access denied (HTTP 403)" in r.stderr
    assert "AZURE_STORAGE_CONNECTION_STRING" in r.stderr and "d3Jvbm" not in r.stderr
    assert not os.path.ismount(mnt)
    # the account name and key as separate variables, the endpoint as an option
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "devstoreaccount1")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", AZURITE_KEY)
    info = run_pcrfs("info", az_corpus, "--json", "--endpoint", azenv.endpoint).stdout
    assert json.loads(info)["images"] > 0


def test_cut_short_object_is_eio_for_its_images_only(azenv, corpus_ds, mount, tmp_path):
    from pcrfs.storage.objclient import ObjectClient
    url = f"az://{CONTAINER}/cut"
    run_pcrfs("push", corpus_ds, url, "-q")
    rec = (corpus_ds / "records" / "r000001.pcr").read_bytes()
    ObjectClient(url).put_bytes("records/r000001.pcr", rec[: len(rec) * 2 // 3])
    local = pcrfs.open_dataset(str(corpus_ds))
    m = mount(url, "--cache-dir", tmp_path / "c", "--io-timeout", "5")
    bad = good = 0
    view = local.views[-1]
    for rel in files_of(local, view):
        try:
            data = read(m.mnt, view, rel)
        except OSError as err:
            assert err.errno == errno.EIO and local.lookup(rel).record == 1
            bad += 1
            continue
        assert same_as_local(data, local, view, rel)
        good += 1
    assert bad > 0 and good > 0
    r = run_pcrfs("verify", url, "-q", check=False)      # and verify names the damage
    assert r.returncode == 1 and "r000001.pcr" in r.stdout


def test_emulator_killed_then_restarted(azurite, azenv, az_corpus, corpus_ds, mount, tmp_path):
    """In-flight reads fail with EIO within --io-timeout, never wrong bytes; after Azurite
    returns, reads recover without a remount; the failures are counted by cause."""
    local = pcrfs.open_dataset(str(corpus_ds))
    io_timeout = 6.0
    m = mount(az_corpus, "--cache-dir", tmp_path / "cache", "--cache-size", "4M",
              "--io-timeout", io_timeout, "--bandwidth-limit", "4M")
    st = killed_then_restarted(m, local, azurite, io_timeout)
    assert st["remote_errors"] > 0
    assert sum(st["remote_error_causes"].values()) == st["remote_errors"]
    assert sum(st["remote_retry_causes"].values()) == st["remote_retries"] > 0
