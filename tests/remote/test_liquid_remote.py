"""Liquid on a real S3 server (SeaweedFS): raw packs pushed with the dataset are served
from the bucket (ranged GETs, checksummed), `pcrfs tune` over an s3:// mount stores its
choice in the bucket, a mount that reuses cached metadata still sees what was pushed or
tuned after it was cached, and a live mount whose packs are pushed again keeps serving."""
import os
import re
import shutil

import pcrfs
from pcrfs.liquid.rules import is_raw
from remote.conftest import BUCKET

from conftest import run_pcrfs


def _raw_files(root):
    return sorted(p for p in (root / "raw").rglob("*.ppm"))


def test_raw_packs_and_tune_over_s3(s3env, crops_ds, mount, tmp_path):
    # ImageNet-sized crops: the corpus's PPMs are 1.2 GB, and each pass reads them all
    dst = tmp_path / "ds"
    shutil.copytree(crops_ds, dst)
    run_pcrfs("materialize", dst, "raw", "--fraction", 0.5, "-q")
    url = f"s3://{BUCKET}/liquid"
    run_pcrfs("push", dst, url, "-q")
    local = pcrfs.open_dataset(str(dst))
    cache = tmp_path / "cache"

    # raw/ over s3://: the materialized half from packs, the rest decoded once
    m = mount(url, "--cache-dir", cache)
    files = _raw_files(m.mnt)
    assert len(files) == local.manifest["images"]
    for f in files:
        rel = os.fsencode(f.relative_to(m.mnt / "raw"))
        assert f.read_bytes() == local.read(rel, "raw"), rel
    st = m.stats()
    materialized = st["raw"]["materialized_share"]
    assert materialized == 0.5
    assert st["raw_pack_reads"] == packed(local, 0.5) > 0
    assert st["raw_decodes"] == len(files) - st["raw_pack_reads"]
    assert st["raw_pack_bytes"] > 0 and st["checksum_failures"] == 0
    assert st["remote_bytes"] >= st["raw_pack_bytes"]

    # tune over the s3:// mount: liquid.json is written into the bucket
    r = run_pcrfs("tune", m.mnt, "--workers", 1, "--sample", 24, "--transform", "none")
    assert f"stored in {url}/liquid.json" in r.stdout, r.stdout
    m.__exit__(None, None, None)

    # a second mount reuses the cached metadata but fetches liquid.json and raw.json again
    m2 = mount(url, "--cache-dir", cache)
    mix = m2.stats()["mix"]
    chosen = re.search(r"chosen: mix=([\d.]+), mix_fidelity=(\d+)", r.stdout)
    assert mix == {"share": float(chosen[1]), "fidelity": int(chosen[2])}, r.stdout
    m2.__exit__(None, None, None)

    run_pcrfs("materialize", dst, "raw", "--fraction", 0.8, "-q")
    run_pcrfs("push", dst, url, "-q")
    m3 = mount(url, "--cache-dir", cache)
    assert m3.stats()["raw"]["materialized_share"] == 0.8
    before = m3.stats()["raw_decodes"]
    for f in _raw_files(m3.mnt):
        rel = os.fsencode(f.relative_to(m3.mnt / "raw"))
        assert f.read_bytes() == local.read(rel, "raw"), rel
    st = m3.stats()
    # the new packs, not ranges cached from the old ones (same keys, other content)
    assert st["raw_pack_reads"] == packed(local, 0.8) > packed(local, 0.5)
    assert st["raw_decodes"] - before + st["raw_cache_hits"] == len(files) - packed(local, 0.8)
    assert st["checksum_failures"] == 0
    m3.__exit__(None, None, None)

    # packs replaced under a live mount (materialize and push again): the heads it read
    # before point into the new packs' bytes, so it reads them again instead of failing
    # with EIO; a fresh disk tier, so every item comes from the bucket
    m4 = mount(url, "--cache-dir", tmp_path / "cache4")
    rels = [os.fsencode(f.relative_to(m4.mnt / "raw")) for f in _raw_files(m4.mnt)]
    want = {rel: local.read(rel, "raw") for rel in rels}
    for rel in rels[::2]:
        assert (m4.mnt / "raw" / os.fsdecode(rel)).read_bytes() == want[rel], rel
    assert m4.stats()["raw_packs_replaced"] == 0
    run_pcrfs("materialize", dst, "raw", "--fraction", 0.3, "-q")
    run_pcrfs("push", dst, url, "-q")
    for rel in rels[1::2]:
        assert (m4.mnt / "raw" / os.fsdecode(rel)).read_bytes() == want[rel], rel
    st = m4.stats()
    assert st["raw_packs_replaced"] >= 1
    assert st["checksum_failures"] == 0


def packed(ds, share):
    return sum(is_raw(e.ordinal, share) for _, e in ds.index.iter_images())
