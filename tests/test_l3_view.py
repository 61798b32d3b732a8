"""MNT/l3/ through the kernel: exact sizes from the first ls, real readers (Pillow plugin,
the torch decoder), the transcode cache across epochs and remounts, torn cache entries,
single-flight transcodes, and a decoder mismatch turning into EIO."""
import errno
import io
import os
import shutil
import threading
import time

import numpy as np
import pytest
from PIL import Image

import pcrfs.l3 as l3
from pcrfs.dataset import open_dataset
from pcrfs.format import sidecar_path
from pcrfs.format.l3meta import read_l3meta, write_l3meta
from pcrfs.torch.l3 import decode_batch
from pcrfs.views import l3 as l3_view_mod  # where the l3 view transcodes

from conftest import run_pcrfs


def _files(root):
    return sorted(p for p in root.rglob("*") if p.is_file())


def _rgb(jpeg: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(jpeg)) as im:
        return np.asarray(im.convert("RGB"))


def test_l3_view_serves_every_image_exactly(edge_ds, mount, tmp_path):
    m = mount(edge_ds, "--cache-dir", tmp_path / "cache")
    ds = open_dataset(str(edge_ds))
    full = f"q{ds.groups}"
    assert (m.mnt / "l3").is_dir() and "l3" in os.listdir(m.mnt)
    q = _files(m.mnt / full)
    files = _files(m.mnt / "l3")
    assert len(files) == len(q) > 10
    sizes = {f: f.stat().st_size for f in files}  # first ls, before any transcode
    assert m.stats()["transcodes"] == 0
    for f in files:
        rel = f.relative_to(m.mnt / "l3")
        data = f.read_bytes()
        assert len(data) == sizes[f]
        src = ds.source_entry(os.fsencode(rel), "l3")
        with Image.open(f) as im:  # the Pillow plugin, by file name through the mount
            assert im.format == "L3" and im.size == (src.width, src.height)
            got = np.asarray(im)
        jpeg_path = m.mnt / full / os.fsdecode(ds.view("l3").source(os.fsencode(rel)))
        assert (got == _rgb(jpeg_path.read_bytes())).all(), rel
        assert os.getxattr(f, "user.pcrfs.view") == b"l3"
    assert m.stats()["transcodes"] == len(files)


def test_torch_decoder_reads_the_mount(corpus_ds, mount, tmp_path):
    m = mount(corpus_ds, "--cache-dir", tmp_path / "cache")
    files = _files(m.mnt / "l3")[:6]
    blobs = [f.read_bytes() for f in files]
    out = decode_batch(blobs, "cpu", layout="NHWC")
    for blob, t in zip(blobs, out, strict=True):
        assert (t.numpy() == l3.decode(blob)).all()


def test_transcode_cache_across_epochs_and_remounts(corpus_ds, mount, tmp_path):
    cache = tmp_path / "cache"
    m = mount(corpus_ds, "--cache-dir", cache)
    files = _files(m.mnt / "l3")[:10]
    first = [f.read_bytes() for f in files]
    assert m.stats()["transcodes"] == 10
    m.__exit__(None, None, None)
    entries = sorted(p for p in cache.rglob("*") if p.is_file())
    assert len(entries) == 10
    # a torn write and a flipped byte: both discarded, never served
    entries[0].write_bytes(entries[0].read_bytes()[:100])
    raw = bytearray(entries[1].read_bytes())
    raw[-5] ^= 0xFF
    entries[1].write_bytes(bytes(raw))
    m2 = mount(corpus_ds, "--cache-dir", cache)
    second = [(m2.mnt / f.relative_to(m.mnt)).read_bytes() for f in files]
    assert second == first
    st = m2.stats()
    assert st["transcode_cache_hits"] == 8 and st["transcodes"] == 2


def test_concurrent_first_reads_transcode_once(corpus_ds, monkeypatch):
    calls = []
    real = l3_view_mod.l3_bytes

    def slow(jpeg):  # widen the race window; the work itself is real
        calls.append(1)
        time.sleep(0.3)
        return real(jpeg)
    monkeypatch.setattr(l3_view_mod, "l3_bytes", slow)
    ds = open_dataset(str(corpus_ds))
    cls = ds.listdir(b"")[0][0]
    path = cls + b"/" + ds.listdir(cls, "l3")[0][0]
    barrier, out = threading.Barrier(6), []

    def read():
        barrier.wait()
        out.append(ds.read(path, "l3"))
    threads = [threading.Thread(target=read) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(out) == 6 and len(set(out)) == 1
    assert ds.stats.transcodes == 1


def test_concurrent_reads_through_the_mount(corpus_ds, mount, tmp_path):
    m = mount(corpus_ds, "--cache-dir", tmp_path / "cache")
    f = _files(m.mnt / "l3")[0]
    out = []
    threads = [threading.Thread(target=lambda: out.append(f.read_bytes())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(out)) == 1 and len(out) == 8
    assert m.stats()["transcodes"] == 1


def test_decoder_mismatch_is_eio_and_others_work(corpus_ds, tmp_path, mount):
    dst = tmp_path / "ds"
    shutil.copytree(corpus_ds, dst)
    ds = open_dataset(str(dst))
    rec = sorted((dst / "records").glob("*.pcr"))[0]
    meta = read_l3meta(sidecar_path(str(rec)), 0, ds.uuid, 16).copy()
    meta["xxh"][0] ^= 1  # as if this machine's JPEG decoder produced other pixels
    write_l3meta(sidecar_path(str(rec)), 0, ds.uuid, [tuple(x) for x in meta.tolist()])
    ds.close()
    run_pcrfs("reindex", dst)
    m = mount(dst, "--cache-dir", "none", "--log", tmp_path / "log")
    ds = open_dataset(str(dst))
    # the damaged record's files, and one of every other record's
    first = {}
    for f in _files(m.mnt / "l3"):
        rec = ds.source_entry(os.fsencode(f.relative_to(m.mnt / "l3")), "l3").record
        first.setdefault(rec, []).append(f)
    files = first.pop(0) + [fs[0] for fs in first.values()]
    assert len(files) == 16 + ds.manifest["records"] - 1
    errors = 0
    for f in files:
        try:
            f.read_bytes()
        except OSError as e:
            assert e.errno == errno.EIO
            errors += 1
    assert errors == 1
    assert m.stats()["checksum_failures"] >= 1  # the kernel may retry a failed read
    assert "build recorded" in (tmp_path / "log").read_text()


def test_views_none_and_reindex_keeps_l3(crops_src, tmp_path):
    plain = tmp_path / "plain"
    run_pcrfs("build", crops_src, plain, "--views", "none", "-q")
    ds = open_dataset(str(plain))
    assert "l3" not in ds.views and not list((plain / "records").glob("*.l3m"))
    ds.close()
    dst = tmp_path / "ds"
    run_pcrfs("build", crops_src, dst, "-q", "--images-per-record", 100)
    before = open_dataset(str(dst))
    cls = before.listdir(b"")[0][0]
    sizes = before.sizes_in_dir(cls, "l3")
    before.close()
    shutil.rmtree(dst / "index.lmdb")
    run_pcrfs("reindex", dst)
    after = open_dataset(str(dst))
    assert after.sizes_in_dir(cls, "l3") == sizes and len(sizes) > 10
    p = run_pcrfs("build", crops_src, tmp_path / "x", "--views", "webp", check=False)
    assert p.returncode == 2 and "unknown format view" in p.stderr


def test_stem_collisions_keep_full_names(tmp_path, mount):
    src = tmp_path / "src" / "cls"
    src.mkdir(parents=True)
    img = Image.fromarray(np.full((20, 30, 3), 90, np.uint8))
    img.save(src / "a.jpg")
    img.save(src / "a.png")
    img.save(src / "b.jpeg")
    dst = tmp_path / "ds"
    run_pcrfs("build", tmp_path / "src", dst, "-q")
    m = mount(dst, "--cache-dir", tmp_path / "cache")
    assert sorted(os.listdir(m.mnt / "l3" / "cls")) == ["a.jpg.l3", "a.png.l3", "b.l3"]
    for n in ("a.jpg.l3", "a.png.l3", "b.l3"):
        with Image.open(m.mnt / "l3" / "cls" / n) as im:
            assert im.size == (30, 20)
    with pytest.raises(FileNotFoundError):
        (m.mnt / "l3" / "cls" / "a.l3").stat()
    # raw/ and the mix's PPM part name their files by the same rule
    m = mount(dst, "-o", "mix=1.0")
    for view in ("raw", "mix"):
        assert sorted(os.listdir(m.mnt / view / "cls")) == ["a.jpg.ppm", "a.png.ppm", "b.ppm"]
        for n in ("a.jpg.ppm", "a.png.ppm", "b.ppm"):
            with Image.open(m.mnt / view / "cls" / n) as im:
                assert im.format == "PPM" and im.size == (30, 20)


def l3_load(path):
    with Image.open(path) as im:
        return im.convert("RGB")


def test_torchvision_imagefolder_over_l3(crops_ds, mount, tmp_path):
    from torchvision import datasets
    m = mount(crops_ds, "--cache-dir", tmp_path / "cache")
    q = datasets.ImageFolder(str(m.mnt / "q5"))
    ds = datasets.ImageFolder(str(m.mnt / "l3"), is_valid_file=lambda p: p.endswith(".l3"),
                              loader=lambda p: Image.open(p).convert("RGB"))
    folder = datasets.DatasetFolder(str(m.mnt / "l3"), loader=l3_load, extensions=(".l3",))
    assert folder.samples == ds.samples
    assert ds.classes == q.classes and len(ds) == len(q) == 240
    assert [y for _, y in ds.samples] == [y for _, y in q.samples]
    img, label = ds[7]
    assert img.size == (500, 375) and label == q.samples[7][1]


def test_disk_cache_is_bounded_and_survives_reopen(tmp_path):
    from pcrfs.storage.diskcache import DiskCache
    c = DiskCache(str(tmp_path / "c"), 3 * 1024)
    for i in range(5):
        c.put(f"k{i}", bytes([i]) * 1000)
    assert c.used <= 3 * 1024 and c.get("k0") is None and c.get("k4") == b"\x04" * 1000
    assert c.get("k2") == b"\x02" * 1000  # now the most recent
    c2 = DiskCache(str(tmp_path / "c"), 2 * 1024)  # reopened smaller: LRU order kept
    assert c2.get("k2") == b"\x02" * 1000 and c2.get("k3") is None
    assert len(list((tmp_path / "c").iterdir())) == 2
