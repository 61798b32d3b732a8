"""Liquid through the kernel: MNT/raw pixels, materialized raw packs (nested, verified,
EIO on damage), MNT/mix under unmodified ImageFolder, the hold's constant hit ratio, and
BalancedBatchSampler's per-batch balance."""
import errno
import math
import os
import shutil
import subprocess
import time

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import datasets, transforms

from pcrfs.dataset import open_dataset
from pcrfs.format.rawpack import HEAD, count_of, decode, head_size, pack_key
from pcrfs.liquid.rules import is_raw, ppm_size, raw_ranks
from pcrfs.torch.balanced import BalancedBatchSampler, quotas, read_layout

from conftest import PCRFS, run_pcrfs, wait_until


def _files(root):
    return sorted(p for p in root.rglob("*") if p.is_file())


def _rgb(path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


@pytest.fixture(scope="module")
def one_record_ds(crops_src, tmp_path_factory):
    """The ImageNet-like crops in one record: reads in any order cost exactly their
    segments (no record extent is ever worth fetching in a small memory budget)."""
    dst = tmp_path_factory.mktemp("liquid") / "ds"
    run_pcrfs("build", crops_src, dst, "--images-per-record", 256, "-q")
    return dst


def _copy(ds, tmp_path):
    out = tmp_path / "ds"
    shutil.copytree(ds, out)
    return out


@pytest.mark.parametrize("which", ["edge_ds", "corpus_ds"])
def test_raw_view_pixels_equal_pillow_decode_of_qG(which, request, mount):
    dst = request.getfixturevalue(which)
    m = mount(dst)
    ds = open_dataset(str(dst))
    full = m.mnt / f"q{ds.groups}"
    raw = _files(m.mnt / "raw")
    sizes = {f: f.stat().st_size for f in raw}     # before any read
    assert m.stats()["raw_decodes"] == 0
    assert len(raw) == len(_files(full)) > 10
    names = set()
    for f in raw:
        rel = f.relative_to(m.mnt / "raw")
        assert f.suffix == ".ppm"
        e = ds.source_entry(os.fsencode(rel), "raw")
        assert sizes[f] == ppm_size(e.width, e.height)
        assert os.getxattr(f, "user.pcrfs.format") == b"ppm"
        data = f.read_bytes()
        assert len(data) == sizes[f] and data.startswith(b"P6\n")
        src = full / os.fsdecode(ds.view("raw").source(os.fsencode(rel)))
        with Image.open(f) as im:
            assert im.mode == "RGB" and im.size == (e.width, e.height)
            assert np.array_equal(np.asarray(im), _rgb(src)), rel
        names.add(str(rel))
    assert len(names) == len(raw)
    assert m.stats()["raw_decodes"] == len(raw)


def test_materialize_is_nested_checksummed_and_damage_is_eio(one_record_ds, tmp_path, mount):
    dst = _copy(one_record_ds, tmp_path)
    ds = open_dataset(str(dst))
    uid, ords = ds.uuid, {e.index: e.ordinal for _, e in ds.index.iter_images()}

    def pack_items(share):
        r = run_pcrfs("materialize", dst, "raw", "--fraction", share, "-q")
        assert f"raw share {share}" in r.stdout
        data = (dst / pack_key(0)).read_bytes()
        pack = decode(data[: head_size(count_of(data[: HEAD.size], "p"))], "p", uid, 0)
        return {int(i) for i in pack.items["index"]}, pack, data
    small, _, _ = pack_items(0.2)
    large, pack, data = pack_items(0.5)
    assert small < large                                     # nested
    ranks = raw_ranks(np.array([ords[i] for i in sorted(ords)], dtype=np.uint64))
    assert large == {i for i, r in zip(sorted(ords), ranks, strict=False) if r < 0.5}
    assert 0.35 < len(large) / len(ords) < 0.65
    again = run_pcrfs("materialize", dst, "raw", "--fraction", 0.5, "-q").stdout
    assert "0 decoded" in again and "1 packs already made" in again     # resumable
    assert "OK" in run_pcrfs("verify", dst).stdout

    m = mount(dst, "-o", "mix=0.5")
    stored = {}     # index in the record -> path below raw/
    for f in _files(m.mnt / "raw"):
        rel = f.relative_to(m.mnt / "raw")
        e = ds.source_entry(os.fsencode(rel), "raw")
        if e.index in large:
            stored[e.index] = rel
    before = m.stats()
    for rel in stored.values():
        (m.mnt / "raw" / rel).read_bytes()
    after = m.stats()
    assert after["raw_pack_reads"] - before["raw_pack_reads"] == len(large)
    assert after["raw_decodes"] == before["raw_decodes"]     # I/O only, no decode
    m.__exit__(None, None, None)

    victim = sorted(large)[3]
    off, n, _ = pack.find(victim)
    buf = bytearray(data)
    buf[off + n // 2] ^= 0x40
    (dst / pack_key(0)).write_bytes(bytes(buf))
    m = mount(dst)
    with pytest.raises(OSError) as err:
        (m.mnt / "raw" / stored[victim]).read_bytes()
    assert err.value.errno == errno.EIO
    (m.mnt / "raw" / stored[sorted(large)[4]]).read_bytes()    # its neighbours still read
    rep = run_pcrfs("verify", dst, check=False)
    assert rep.returncode == 1
    bad = os.fsdecode(ds.view("raw").source(os.fsencode(stored[victim])))
    assert f"DAMAGED {bad}: raw: item {victim} of {pack_key(0)} is damaged" in rep.stdout


def test_materialize_killed_midway_is_not_vouched_for_and_resumes(crops_src, tmp_path, mount):
    """SIGKILL once a pack is written: no raw.json, so verify calls it unfinished and a
    mount decodes instead of trusting packs; the rerun keeps every finished pack, decodes
    only the rest, and leaves no temporary behind."""
    dst = tmp_path / "ds"
    run_pcrfs("build", crops_src, dst, "--images-per-record", 8, "-q")
    ds = open_dataset(str(dst))
    per_record = {}
    for _, e in ds.index.iter_images():
        per_record[e.record] = per_record.get(e.record, 0) + 1
    proc = subprocess.Popen([PCRFS, "materialize", str(dst), "raw", "--fraction", "1.0", "-q",
                             "--jobs", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    raw = dst / "raw"
    wait_until(lambda: proc.poll() is not None or any(raw.glob("r*.ppk")), 120,
               "a first raw pack", interval=0.001)
    proc.kill()
    proc.wait()
    done = sorted(int(p.name[1:7]) for p in raw.glob("r*.ppk"))
    assert 0 < len(done) < len(per_record), "not killed midway: the test proved nothing"
    assert not (dst / "raw.json").exists()
    rep = run_pcrfs("verify", dst)
    assert "unfinished `pcrfs materialize`" in rep.stdout, rep.stdout

    m = mount(dst)
    assert m.stats()["raw"]["materialized_share"] == 0.0
    files = _files(m.mnt / "raw")
    for f in files[:: len(files) // 5]:
        rel = os.fsencode(f.relative_to(m.mnt / "raw"))
        assert f.read_bytes() == ds.read(rel, "raw"), rel
    assert m.stats()["raw_pack_reads"] == 0
    m.__exit__(None, None, None)

    out = run_pcrfs("materialize", dst, "raw", "--fraction", "1.0", "-q").stdout
    decoded = sum(n for r, n in per_record.items() if r not in done)
    assert f"({decoded} decoded, 0 reused, {len(done)} packs already made)" in out, out
    assert not list(raw.glob("*.tmp"))
    assert "OK" in run_pcrfs("verify", dst).stdout


def test_unstored_raw_files_stay_on_disk_and_stored_ones_pass_the_limit(one_record_ds,
                                                                         tmp_path, mount):
    """An image the packs do not hold is decoded on its first read and kept in the disk
    cache, so the next mount reads it from there, decoding nothing.  A stored one costs
    its pack bytes, which pass through --bandwidth-limit as record bytes do."""
    dst = _copy(one_record_ds, tmp_path)
    run_pcrfs("materialize", dst, "raw", "--fraction", 0.3, "-q")
    ds = open_dataset(str(dst))
    cache = tmp_path / "cache"
    m = mount(dst, "--cache-dir", cache)
    rels = [f.relative_to(m.mnt / "raw") for f in _files(m.mnt / "raw")]
    stored = [r for r in rels if is_raw(ds.source_entry(os.fsencode(r), "raw").ordinal, 0.3)]
    assert 0 < len(stored) < len(rels)
    first = {r: (m.mnt / "raw" / r).read_bytes() for r in rels}
    s = m.stats()
    assert s["raw_pack_reads"] == len(stored) and s["raw_decodes"] == len(rels) - len(stored)
    assert s["raw_cache_hits"] == 0
    m.__exit__(None, None, None)

    m = mount(dst, "--cache-dir", cache)
    for r in rels:
        assert (m.mnt / "raw" / r).read_bytes() == first[r], r
    s = m.stats()
    assert s["raw_decodes"] == 0 and s["raw_cache_hits"] == len(rels) - len(stored)
    assert s["raw_pack_reads"] == len(stored)
    m.__exit__(None, None, None)

    rate = 4 << 20
    m = mount(dst, "--bandwidth-limit", "4M", "--cache-dir", "none")
    t = time.monotonic()
    for r in stored[:12]:
        assert (m.mnt / "raw" / r).read_bytes() == first[r]
    elapsed = time.monotonic() - t
    s = m.stats()
    assert s["raw_decodes"] == 0 and s["raw_pack_reads"] == 12
    total = s["raw_pack_bytes"] + s["backend_bytes"]
    assert s["raw_pack_bytes"] >= 12 * min(len(first[r]) for r in stored)
    # the bucket allows a 50 ms burst; everything else flows at the limit
    assert elapsed >= (total - 0.05 * rate) / rate * 0.95, (elapsed, total)


def test_imagefolder_over_mix_equals_qG(one_record_ds, tmp_path, mount):
    dst = _copy(one_record_ds, tmp_path)
    run_pcrfs("materialize", dst, "raw", "--fraction", 0.3, "-q")
    m = mount(dst, "-o", "mix=0.5")                   # part stored, part decoded on read
    ds = open_dataset(str(dst))
    tf = transforms.ToTensor()
    mix = datasets.ImageFolder(str(m.mnt / "mix"), transform=tf)
    full = datasets.ImageFolder(str(m.mnt / f"q{ds.groups}"), transform=tf)
    assert mix.classes == full.classes and mix.class_to_idx == full.class_to_idx
    assert len(mix) == len(full) == 240
    fmts = [os.getxattr(p, "user.pcrfs.format") for p, _ in mix.samples]
    assert 0.35 < fmts.count(b"ppm") / len(fmts) < 0.65
    assert all(p.endswith(".ppm") == (f == b"ppm") for (p, _), f in zip(mix.samples, fmts, strict=False))
    for i in range(len(mix)):
        a, ya = mix[i]
        b, yb = full[i]
        assert ya == yb and torch.equal(a, b), mix.samples[i][0]
    # FastImageFolder over the same mix: the same samples; its fused crops of the JPEG
    # files equal those of qG's, and of the PPMs (qG's pixels, resized without DCT
    # scaling) come within 30 dB of them, box for box
    from pcrfs.torch import FastImageFolder
    fmix = FastImageFolder(m.mnt / "mix", size=48, seed=5)
    ffull = FastImageFolder(m.mnt / f"q{ds.groups}", size=48, seed=5)
    assert fmix.samples == mix.samples
    assert sum(len(y) for _, y in fmix.loader(batch_size=32, threads=2)) == len(mix)
    assert fmix.epoch == 1              # a loader's epoch ends: the next draws new boxes
    fmix.set_epoch(0)
    for i in range(0, len(fmix), 5):
        a, b = fmix[i][0].double(), ffull[i][0].double()
        if fmix.samples[i][0].endswith(".ppm"):
            mse = float(((a - b) ** 2).mean())
            assert mse == 0 or 10 * np.log10(255 ** 2 / mse) >= 30, fmix.samples[i][0]
        else:
            assert torch.equal(a, b), fmix.samples[i][0]
    layout = read_layout(str(m.mnt))
    assert sorted(layout) == sorted(os.path.relpath(p, m.mnt / "mix") for p, _ in mix.samples)
    assert [layout[os.path.relpath(p, m.mnt / "mix")][0].encode() for p, _ in mix.samples] == fmts
    # the mix's JPEG part at k < G: sizes are those of qk
    m2 = mount(dst, "-o", "mix=0.5,mix_fidelity=3")
    for p, _ in mix.samples[:20]:
        rel = os.path.relpath(p, m.mnt / "mix")
        f = m2.mnt / "mix" / rel
        want = (m2.mnt / "q3" / rel).stat().st_size if not rel.endswith(".ppm") else \
            os.path.getsize(p)
        assert f.stat().st_size == want and len(f.read_bytes()) == want


def test_hold_makes_every_epoch_load_the_same_bytes(one_record_ds, tmp_path, mount):
    dst = _copy(one_record_ds, tmp_path)
    run_pcrfs("materialize", dst, "raw", "--fraction", 1.0, "-q")
    m = mount(dst, "--cache-size", "48M", "-o", "mix=0.5,hold=24M")
    layout = read_layout(str(m.mnt))
    sizes = {rel: (m.mnt / "mix" / rel).stat().st_size for rel in layout}
    held = {rel for rel, (_, h, _, _) in layout.items() if h}
    assert 0 < len(held) < len(layout) and sum(sizes[r] for r in held) <= 24 << 20

    def loaded(rels):   # what storage gives for these files: PPMs whole, JPEGs less EOI
        return sum(sizes[r] - (0 if r.endswith(".ppm") else 2) for r in rels)

    def counted():
        s = m.stats()
        return s["backend_bytes"] + s["raw_pack_bytes"]
    rng = np.random.default_rng(0)
    per_epoch = []
    for _ in range(3):
        before = counted()
        for i in rng.permutation(len(layout)):
            rel = sorted(layout)[i]
            assert len((m.mnt / "mix" / rel).read_bytes()) == sizes[rel]
        per_epoch.append(counted() - before)
    assert per_epoch[0] == loaded(layout)
    assert per_epoch[1] == per_epoch[2] == loaded(set(layout) - held)
    tier = m.stats()["cache_tiers"]["hold"]
    assert tier["hits"] == 2 * len(held)


def test_bad_mix_options_are_refused(one_record_ds, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    for opt, words in (("mix=1.5", "between 0 and 1"), ("mix_fidelity=q99", "out of range"),
                       ("hold=lots", "not a size")):
        r = run_pcrfs("mount", one_record_ds, mnt, "-o", opt, check=False)
        assert r.returncode != 0 and words in r.stderr, (opt, r.stderr)
        assert not os.path.ismount(mnt)
    r = run_pcrfs("mount", one_record_ds, mnt, "--cache-size", "8M", "-o", "hold=64M", check=False)
    assert r.returncode != 0 and "memory budget" in r.stderr and not os.path.ismount(mnt)
    r = run_pcrfs("materialize", one_record_ds, "raw", "--fraction", "2", check=False)
    assert r.returncode != 0 and "between 0 and 1" in r.stderr


def test_mix_tsv_escapes_names_and_round_trips(small_src, tmp_path, mount):
    """Paths with a tab, a newline or a backslash survive mix.tsv: read_layout gives back
    exactly the mix/ file names, and each line's format is the file's xattr."""
    odd = small_src / "c0"
    for i, name in enumerate(["tab\there.jpg", "new\nline.jpg", "back\\slash.jpg",
                              "literal\\t.jpg"]):
        shutil.copy(sorted(odd.glob("im*.jpg"))[i], odd / name)
    (small_src / "c\t1").mkdir()
    shutil.copy(sorted(odd.glob("im*.jpg"))[0], small_src / "c\t1" / "a\\n.jpg")
    dst = tmp_path / "ds"
    run_pcrfs("build", small_src, dst, "-q")
    m = mount(dst, "-o", "mix=0.5")
    root = m.mnt / "mix"
    files = {os.path.relpath(p, root) for p in _files(root)}
    layout = read_layout(str(m.mnt))
    assert set(layout) == files and len(files) == 29
    assert {"c0/tab\there", "c0/new\nline", "c0/back\\slash", "c0/literal\\t",
            "c\t1/a\\n"} <= {os.path.splitext(f)[0] for f in files}
    for rel, (fmt, _, _, _) in layout.items():
        assert os.getxattr(root / rel, "user.pcrfs.format") == fmt.encode(), rel
    raw = (m.mnt / ".pcrfs" / "mix.tsv").read_bytes()
    assert raw.count(b"\n") == 30 and b"\\t" in raw and b"\\n" in raw and b"\\\\" in raw


def test_bulk_files_render_in_a_worker_thread(small_src, tmp_path):
    """mix.tsv is O(dataset) to render: the first lookup of .pcrfs/ or of the file does it
    in a worker thread (View.pending), never on the trio thread, and only once."""
    import threading

    import pyfuse3
    import trio

    from pcrfs.fs.operations import PcrfsOperations
    dst = tmp_path / "ds"
    run_pcrfs("build", small_src, dst, "-q")
    ops = PcrfsOperations(open_dataset(str(dst)))
    control = ops.root.view(ops.root.ids[b".pcrfs"])
    once = control._bulk[b"mix.tsv"]
    make, threads = once._make, []

    def spy():
        threads.append(threading.current_thread())
        return make()
    once._make = spy

    async def main():
        pcrfs_dir = await ops.lookup(pyfuse3.ROOT_INODE, b".pcrfs")
        assert not threads       # looking the directory up renders nothing
        fh = await ops.opendir(pcrfs_dir.st_ino, None)
        await ops.releasedir(fh)
        a = await ops.lookup(pcrfs_dir.st_ino, b"mix.tsv")
        return a.st_size
    size = trio.run(main)
    assert len(threads) == 1 and threads[0] is not threading.main_thread()
    assert size == len(make()) > 24 * 10


# -- BalancedBatchSampler -------------------------------------------------------------
STRATA = [("ppm", False)] * 300 + [("jpeg", False)] * 700 + [("ppm", True)] * 50 \
    + [("jpeg", True)] * 157


@pytest.mark.parametrize("batch", [1, 7, 32, 100])
def test_balanced_batches_hold_the_mix_exactly(batch):
    s = BalancedBatchSampler(None, batch, strata=STRATA, seed=3)
    batches = list(s)
    assert len(batches) == len(s) == math.ceil(len(STRATA) / batch)
    assert sorted(i for b in batches for i in b) == list(range(len(STRATA)))
    share = {k: STRATA.count(k) / len(STRATA) for k in set(STRATA)}
    seen = {k: 0 for k in share}
    drawn = 0
    for b in batches[:-1]:
        assert len(b) == batch
        counts = {k: sum(STRATA[i] == k for i in b) for k in share}
        for k, n in counts.items():       # floor or ceiling of the stratum's share
            assert math.floor(batch * share[k]) <= n <= math.ceil(batch * share[k]), (k, n)
            seen[k] += n
        drawn += len(b)
        for k in share:                   # rounding is carried: never a whole image behind
            assert abs(seen[k] - drawn * share[k]) < 1
    other = list(BalancedBatchSampler(None, batch, strata=STRATA, seed=3))
    assert other == batches
    s.set_epoch(1)
    assert list(s) != batches


def test_balanced_sampler_under_ddp_is_disjoint_and_complete():
    for replicas in (2, 3, 4):
        got = []
        for rank in range(replicas):
            s = BalancedBatchSampler(None, 16, strata=STRATA, num_replicas=replicas, rank=rank)
            bs = list(s)
            assert len(bs) == len(s)
            assert all(len(b) == 16 for b in bs[:-1])
            got += [i for b in bs for i in b]
        assert len(got) == len(set(got)) == len(STRATA)


def test_quotas_use_every_stratum_up():
    q = quotas([5, 0, 3], [4, 4])
    assert [sum(x) for x in q] == [4, 4] and [sum(c[s] for c in q) for s in range(3)] == [5, 0, 3]


def test_balanced_sampler_reads_the_mount_layout(one_record_ds, tmp_path, mount):
    dst = _copy(one_record_ds, tmp_path)
    m = mount(dst, "--cache-size", "64M", "-o", "mix=0.4,hold=16M")
    ds = datasets.ImageFolder(str(m.mnt / "mix"))
    s = BalancedBatchSampler(ds, 24)
    layout = read_layout(str(m.mnt))
    kinds = [layout[os.path.relpath(p, m.mnt / "mix")][:2] for p, _ in ds.samples]
    assert len(set(kinds)) == 4          # ppm/jpeg x held/not
    for b in list(s)[:-1]:
        for k in set(kinds):
            share = kinds.count(k) / len(kinds)
            n = sum(kinds[i] == k for i in b)
            assert math.floor(24 * share) <= n <= math.ceil(24 * share)
    loader = torch.utils.data.DataLoader(ds, batch_sampler=s, num_workers=2,
                                         collate_fn=lambda items: [y for _, y in items])
    labels = [y for batch in loader for y in batch]
    assert sorted(labels) == sorted(y for _, y in ds.samples)


def test_tune_model_charges_the_daemon_cpu_to_the_cores():
    """The closed form with the daemon on the workers' cores: hand-computed values."""
    from pcrfs.liquid.model import Model
    m = Model(workers=2, cores=2)
    m.load = {"raw": 1.4e-3, "q10": 0.1e-3}
    m.decode = {"raw": 0.9e-3, "q10": 2e-3}
    m.daemon = {"raw": 0.9e-3, "q10": 0.05e-3}
    # r = 1: io 1.4 ms, CPU 2 x 0.9 + 0.9 = 2.7 ms on 2 cores (1.35 ms each): the bounds
    # allow 714 and 741 img/s, but two workers that each load, then decode, make 2 / 4.1 ms
    assert m.predict(1.0, 10) == pytest.approx(2 / 4.1e-3)
    many = Model(workers=8, cores=2)             # 8 workers overlap: Liquid's min(load, CPU)
    many.load, many.decode, many.daemon = m.load, m.decode, m.daemon
    assert many.predict(1.0, 10) == pytest.approx(1 / 1.4e-3)
    many.load = {"raw": 0.5e-3}
    assert many.predict(1.0, 10) == pytest.approx(1 / 1.35e-3)
    assert m.sides(1.0, 10) == pytest.approx((1.4e-3, 1.35e-3))
    without = Model(2, 2)
    without.load, without.decode = m.load, m.decode
    assert without.predict(1.0, 10) > m.predict(1.0, 10)          # the daemon costs
    # load 0.1 + 1.9 r ms meets CPU (2 (2 - 1.1 r) + 0.05 + 0.85 r) / 2 = 2.025 - 0.675 r
    m.load["raw"] = 2e-3
    assert m.crossing(10) == pytest.approx(1.925 / 2.575, abs=2e-3)
    m.load = {"raw": 9e-3, "q10": 3e-3}                           # I/O-bound at r = 0
    assert m.crossing(10) == 0.0


@pytest.mark.parametrize("workers", [1, 2, 3, 8])
def test_throughput_lies_between_no_overlap_and_the_bottleneck(workers):
    """One worker cannot overlap at all; more reach the bottleneck; no I/O gives the
    cores' rate exactly."""
    from pcrfs.liquid.model import throughput
    rng = np.random.default_rng(workers)
    for io, cpu in rng.uniform(1e-4, 5e-3, size=(200, 2)):
        x = throughput(io, cpu, workers, 2)
        busy = min(workers, 2)
        assert 1 / (io + cpu) * (1 - 1e-9) <= x <= 1 / max(io, cpu / busy) * (1 + 1e-9)
        if workers == 1:
            assert x == pytest.approx(1 / (io + cpu))
        assert throughput(0.0, cpu, workers, 2) == pytest.approx(busy / cpu)
    assert throughput(1e-3, 2e-3, 8, 2) == pytest.approx(1000)          # the cores' bound
    assert throughput(1e-3, 2e-3, 2, 2) == pytest.approx(2 / 3e-3)      # the workers'


@pytest.mark.parametrize("workers,batches", [(2, 8), (2, 20), (3, 12), (1, 5)])
def test_steady_rate_does_not_credit_the_first_batches_of_the_other_workers(workers, batches):
    """W workers started together deliver W batches per service time, their first W
    together: the steady rate is W batches per service time, whatever the pass length
    (timing from the first arrival gave 7/6 of it for 8 batches at W = 2)."""
    from pcrfs.liquid.measure import steady_rate
    clock = [0.0]

    def loader():
        for i in range(batches):
            clock[0] = 0.3 + i // workers          # service time 1 s, fill 0.3 s extra
            yield torch.zeros(32, 1)
    clock[0] = 0.0
    assert steady_rate(loader(), workers, clock=lambda: clock[0]) == pytest.approx(32 * workers)

    def one():
        clock[0] = 2.0
        yield torch.zeros(7, 1)
    clock[0] = 0.0                  # a lone batch: the whole pass, its fill included
    assert steady_rate(one(), workers, clock=lambda: clock[0]) == pytest.approx(3.5)

def _probe(share, k, load, decode):
    from pcrfs.liquid.model import Probe
    return Probe(share, k, load, decode, min(load, decode), 0.0, 0.0)


def test_tune_pick_prefers_fidelity_within_three_percent_of_the_fastest():
    from pcrfs.liquid.search import NEAR, pick
    assert NEAR == 0.97
    ps = [_probe(0.9, 10, 430, 900), _probe(0.0, 5, 900, 484), _probe(0.0, 3, 900, 492),
          _probe(0.0, 1, 900, 495)]
    assert (pick(ps).share, pick(ps).fidelity) == (0.0, 5)        # 484 >= 0.97 x 495
    ps[1] = _probe(0.0, 5, 900, 478)                              # 5 falls out: 3 wins
    assert pick(ps).fidelity == 3
    same_k = [_probe(0.1, 10, 445, 900), _probe(0.2, 10, 900, 440), _probe(0.3, 10, 300, 900)]
    assert pick(same_k).share == 0.1                              # same k: the fastest


class _Scripted:
    """Tuner.run's decisions over scripted probe rates: (share, k) -> (load, decode)."""

    def __init__(self, rates, min_fidelity, G=10, seq=None):
        from pcrfs.liquid.search import Tuner, pick
        self.rates, self.min_fidelity, self.probes = rates, min_fidelity, {}
        self.seq = seq            # k -> (load, decode) of b_k, or None: q only
        self.raw_ok = True
        self.sample = type("S", (), {"groups": G, "paths": lambda *_: []})()
        self.run = Tuner.run.__get__(self)
        self.search_share = Tuner.search_share.__get__(self)
        self.confirm = pick       # by the model: end to end has its own test

    def _fit(self, fmt, paths):
        pass

    def probe(self, share, k):
        key = (round(share, 1), k)
        if key not in self.probes:
            self.probes[key] = _probe(share, k, *self.rates(share, k))
        return self.probes[key]

    def probe_seq(self, k):
        p = self.probes.setdefault((0.0, k, "b"), _probe(0.0, k, *self.seq(k)))
        p.coding = "b"
        return p


def test_tune_weighs_b_views_beside_every_pure_q_probe():
    """With Pillow's decode, b_k is probed beside each k probed at r = 0 (never below the
    floor) and wins where it is faster; within 3% the higher fidelity still wins."""
    def cpu_bound(share, k):
        return 2000 - 1000 * share, 400 + 80 * (10 - k) + 100 * share
    best, probes = _Scripted(cpu_bound, 8, seq=lambda k: (2000, 700 + 10 * (10 - k))).run()
    assert {p.fidelity for p in probes if p.coding == "b"} == {8, 9, 10}
    assert (best.coding, best.fidelity, best.view) == ("b", 10, "b10")   # 700, within 3% of b8
    best, _ = _Scripted(cpu_bound, None, seq=lambda k: (2000, 300)).run()
    assert best.coding == "q" and best.view == "mix"                   # slower than r = 1


def test_tune_lowers_k_only_when_allowed_or_io_bound():
    """CPU-bound at qG (raw helps up to r = 0.6), lower k decodes faster: by default k stays
    G; with min_fidelity K the share is searched again at the k that leads, never below K."""
    def cpu_bound(share, k):
        decode = 400 + 80 * (10 - k) + 300 * share            # raw and low k decode faster
        load = 2000 - 2600 * share if share <= 0.5 else 700 - 1200 * (share - 0.5)
        return load, decode
    best, _ = _Scripted(cpu_bound, None).run()
    assert (best.fidelity, best.share) == (10, 0.6)           # load 580 = decode 580
    best, probes = _Scripted(cpu_bound, 4).run()
    assert min(p.fidelity for p in probes) == 4
    # q4 leads at r = 0 (880 against 800 at q5), then raw lifts it to 970 at r = 0.3
    assert (best.fidelity, best.share) == (4, 0.3) and best.rate == 970
    assert {p.share for p in probes if p.fidelity == 4} >= {0.2, 0.3, 0.4, 0.5}

    def io_bound(share, k):                                     # bytes fall 15% per step of k
        return 300 * 1.15 ** (10 - k) * (1 - 0.9 * share), 900
    best, probes = _Scripted(io_bound, None).run()
    assert best.share == 0.0 and min(p.fidelity for p in probes) == 1
    assert best.fidelity == 2               # k <= 2 reach the decode rate; 3 is 11% slower
    assert best.rate >= 0.95 * max(p.rate for p in probes)
    best, probes = _Scripted(io_bound, 6).run()
    assert best.fidelity == 6 and min(p.fidelity for p in probes) == 6


def test_tune_charges_a_mixed_probe_at_least_the_first_reads_costs():
    """A mixed probe re-reads files the daemon may serve from memory: its load and I/O
    CPU are at least the pure formats' first-read costs, mixed in r."""
    from pcrfs.liquid.model import Model
    from pcrfs.liquid.search import Tuner
    t = Tuner.__new__(Tuner)
    t.model, t.probes, t.log = Model(2, 2), {}, lambda *_: None
    t.model.load = {"raw": 10e-3, "q10": 1e-3}
    t.model.decode = {"raw": 1e-3, "q10": 2e-3}
    t.model.daemon = {"raw": 2e-3, "q10": 0.5e-3}
    t.model.size = {"raw": 560e3, "q10": 20e3}
    t.reader = {"raw": 0.7e-3, "q10": 0.1e-3}
    t.sample = type("S", (), {"paths": lambda self, share, k: []})()
    t._measure = lambda paths: (0.5e-3, 1.5e-3, 50e-6, 80e-6, 76e3)   # warm, from memory
    p = t.probe(0.2, 10)
    assert 1 / p.load == pytest.approx(0.2 * 10e-3 + 0.8 * 1e-3)
    assert p.reader_us == pytest.approx(1e6 * (0.2 * 0.7e-3 + 0.8 * 0.1e-3))
    io_cpu = 0.2 * 2e-3 + 0.8 * 0.5e-3
    assert p.daemon_us + p.reader_us == pytest.approx(io_cpu * 1e6)
    assert p.rate == pytest.approx(t.model.rate(1 / p.load, 1.5e-3, io_cpu))
    t._measure = lambda paths: (50e-3, 1.5e-3, 5e-3, 1e-3, 76e3)       # slower: kept
    p = t.probe(0.3, 10)
    assert 1 / p.load == pytest.approx(50e-3) and p.daemon_us == pytest.approx(5e3)


def test_tune_confirms_the_finalists_end_to_end(tmp_path):
    """The probes within FINAL of the model's fastest are measured end to end, ROUNDS
    interleaved passes each after one untimed pass; each keeps its median pass, every
    pass capped by the bandwidth limit over its files' bytes, and `pick` chooses by
    those rates."""
    from pcrfs.liquid.sample import Sample
    from pcrfs.liquid.search import FINAL, FINALISTS, PASS, ROUNDS, Tuner, finalists
    items = [(f"{i}.jpg", f"{i}.ppm") for i in range(100)]
    for view, size in (("raw", 1000), ("q10", 100), ("q5", 50)):
        (tmp_path / view).mkdir()
        for rel, raw in items:
            (tmp_path / view / (raw if view == "raw" else rel)).write_bytes(b"x" * size)

    sizes = []

    class S:
        mnt, path = str(tmp_path), Sample.path

        def passes(self, count, size):
            sizes.append(size)
            return [[(items[i * 10 + j], j / 10) for j in range(10)] for i in range(count)]

    A, B, C, D, E = (_probe(0.0, 10, 500, 900), _probe(0.5, 10, 340, 900),
                     _probe(1.0, 10, 300, 900), _probe(0.0, 5, 480, 900),
                     _probe(0.2, 10, 320, 900))
    cands = finalists([C, B, E, A, D])
    assert FINAL == 0.65 and cands == [A, D, B]        # 0.65 x 500 = 325: C and E out
    six = [_probe(0.1 * i, 10, 500 - i, 900) for i in range(7)]
    assert finalists(six) == six[:FINALISTS] and FINALISTS == 5     # the fastest five
    assert ROUNDS == 3
    # three rounds of (A, D, B) after the untimed pass
    seen, rates = [], iter([400, 470, 600, 420, 510, 300, 450, 460, 580])

    def through(paths, prepare):
        for i in range(len(paths)):
            prepare(i)
        seen.extend(paths)
        return [next(rates) for _ in paths[1:]]
    t = Tuner.__new__(Tuner)
    t.sample, t.workers, t.limit, t.log, t.pass_size = S(), 2, 300_000, lambda *_: None, PASS
    t.decoders = type("D", (), {"through": staticmethod(through)})()
    best = t.confirm(cands)
    assert len(seen) == 1 + ROUNDS * 3
    kinds = [{os.path.basename(os.path.dirname(p)) for p in paths} for paths in seen]
    assert kinds == [{"q10"}] + [{"q10"}, {"q5"}, {"raw", "q10"}] * ROUNDS   # A first, untimed
    assert [sum(p.startswith(str(tmp_path / "raw")) for p in x) for x in seen[3::3]] == [5] * 3
    # B's 5 raw + 5 q10 files hold 5,500 bytes: 300 kB/s allow 545 of 600 and 580 img/s
    assert (A.measured, D.measured) == (420, 470)                 # medians, not the best
    assert B.measured == pytest.approx(300_000 * 10 / 5500)
    assert best is B and C.measured == E.measured == 0.0
    assert {p.regime for p in cands} == {"cold"}               # a bandwidth limit: storage
    rates = iter([350, 300, 330])
    t.pass_size = 48                                  # from a small --sample
    assert finalists([A]) == [A] and t.confirm([A]) is A and A.measured == 330   # afresh
    assert sizes == [PASS, 48] and PASS == 384


def test_tune_confirms_warm_only_what_the_page_cache_would_hold(tmp_path, monkeypatch):
    """Without a bandwidth limit or a hold, a finalist whose whole-dataset bytes fit in
    WARM_ROOM of the free memory is measured warm: each pass's files are read through
    just before it and left cached.  Any other is measured cold: its pages dropped."""
    import pcrfs.liquid.search as search
    from pcrfs.liquid.model import Model
    from pcrfs.liquid.sample import Sample
    from pcrfs.liquid.search import WARM_ROOM, Tuner
    items = [(f"{i}.jpg", f"{i}.ppm") for i in range(70)]

    class S:
        mnt, path, total = str(tmp_path), Sample.path, 1000

        def passes(self, count, size):
            return [[(items[i * 10 + j], j / 10) for j in range(10)] for i in range(count)]
    t = Tuner.__new__(Tuner)
    t.sample, t.workers, t.limit, t.hold, t.pass_size = S(), 2, None, False, 10
    t.log = lambda *_: None
    t.model = Model(2, 2)
    t.model.size = {"raw": 500e3, "q10": 20e3}
    raw, jpeg = _probe(1.0, 10, 900, 900), _probe(0.0, 10, 900, 800)
    room = int(1000 * 500e3 / WARM_ROOM)                 # the raw dataset just fits
    assert t.regime(raw, room) == "warm" and t.regime(raw, room - 10) == "cold"
    assert t.regime(jpeg, room // 25) == "warm"          # 20 MB of q10 files
    t.hold = True
    assert t.regime(jpeg, room) == "cold"                # direct I/O: never cached
    t.hold, t.limit = False, 100_000_000
    assert t.regime(jpeg, room) == "cold"                # the limit stands for storage
    t.limit = None
    loaded, dropped = [], []
    monkeypatch.setattr(search, "load", lambda paths, w: loaded.append(list(paths)))
    monkeypatch.setattr(search, "drop_pages", dropped.append)
    monkeypatch.setattr(search, "page_cache_room", lambda: room // 2)   # raw no longer fits

    def through(paths, prepare):
        for i in range(len(paths)):
            prepare(i)
        return [100.0] * (len(paths) - 1)
    t.decoders = type("D", (), {"through": staticmethod(through)})()
    t.confirm([jpeg, raw])
    assert (jpeg.regime, raw.regime) == ("warm", "cold")
    # passes: jpeg (untimed), then (jpeg, raw) x 3; a raw pass's files are read once
    # (those not stored get produced), then dropped
    assert [len(x) for x in loaded] == [10] * 7
    assert all("/q10/" in p for i in (0, 1, 3, 5) for p in loaded[i])
    assert all("/raw/" in p for i in (2, 4, 6) for p in loaded[i])
    assert sorted(dropped) == sorted(p for i in (2, 4, 6) for p in loaded[i])


def _end_to_end_regimes(out: str) -> set[str]:
    """The regimes tune's "end to end" lines name ("... img/s warm (model ...)")."""
    return {line.split(" (model")[0].split()[-1] for line in out.splitlines()
            if line.lstrip().startswith("end to end")}


def test_tune_moves_both_ways_and_stores_its_choice(one_record_ds, tmp_path, mount):
    """CPU-bound (no limit, the ImageNet transform): more raw.  I/O-bound (a limit far
    below what raw files need): no raw, and lower k is tried.  The choice is stored in
    the dataset and a later mount's mix/ serves it; a mount already live keeps its mix."""
    import json
    dst = _copy(one_record_ds, tmp_path)
    run_pcrfs("materialize", dst, "raw", "--fraction", 1.0, "-q")
    m = mount(dst)
    r = run_pcrfs("tune", m.mnt, "--workers", 2, "--sample", 60)
    assert "share" in r.stdout and "predicted" in r.stdout and "<- chosen" in r.stdout
    assert "3 passes of 120 images each" in r.stdout     # 2 x --sample, below PASS
    stored = json.loads((dst / "liquid.json").read_text())
    assert stored["share"] >= 0.5, r.stdout           # decode-bound: raw pays
    assert stored["fidelity"] == open_dataset(str(dst)).groups
    assert len(stored["probes"]) >= 3
    # the I/O path's CPU is measured and charged: the daemon's and the reading threads'
    raw = next(p for p in stored["probes"] if p["share"] == 1.0)
    assert raw["daemon_us"] > 0 and raw["reader_us"] > 0, raw
    # the choice was measured end to end, over images the probes did not read
    assert "end2end" in r.stdout and stored["measured_images_per_s"] > 0
    chosen = next(p for p in stored["probes"]
                  if (p["share"], p["fidelity"]) == (stored["share"], stored["fidelity"]))
    assert chosen["measured"] == pytest.approx(stored["measured_images_per_s"], abs=0.05), r.stdout
    # no limit, no hold, a dataset far smaller than memory: epochs from the page cache
    assert chosen["regime"] == "warm"
    assert _end_to_end_regimes(r.stdout) == {"warm"}, r.stdout
    from pcrfs.liquid.sample import Sample
    s = Sample(str(m.mnt), 60)
    sets = s.passes(3, 50)
    names = [{it for it, _ in x} for x in sets]
    assert [len(x) for x in names] == [50] * 3 and not set.intersection(*names)
    assert not set().union(*names) & set(s.items)          # none the probes read
    # 240 images, 179 never probed: the sets go round those in one order, each file
    # read again only after all the others
    cycle = [it for x in s.passes(4, 100) for it, _ in x]
    assert len(cycle) == 400 and len(set(cycle)) == 179
    assert all(cycle[i] == cycle[i + 179] for i in range(400 - 179))
    assert not set(cycle) & set(s.items)
    assert "OK" in run_pcrfs("verify", dst).stdout
    m2 = mount(dst)
    assert m2.stats()["mix"] == {"share": stored["share"], "fidelity": stored["fidelity"]}
    listed = _files(m2.mnt / "mix")

    # 4M: qG is I/O-bound at well under any decode rate here (at 8M a loaded run read qG
    # faster than it decoded it, and no lower k was tried)
    slow = mount(dst, "--bandwidth-limit", "4M")
    r = run_pcrfs("tune", slow.mnt, "--workers", 2, "--sample", 40, "--transform", "none")
    chosen = next(line for line in r.stdout.splitlines() if line.startswith("closed form"))
    assert "mix=0.0" in chosen, r.stdout               # I/O-bound: no raw
    assert _end_to_end_regimes(r.stdout) == {"cold"}, r.stdout
    assert any(line.split()[:2] == ["0.0", "q1"] for line in r.stdout.splitlines()), r.stdout
    now = json.loads((dst / "liquid.json").read_text())
    assert now["share"] == 0.0 < stored["share"]
    # a choice stored under a live mount leaves that mount's mix as it was
    assert m2.stats()["mix"] == {"share": stored["share"], "fidelity": stored["fidelity"]}
    assert _files(m2.mnt / "mix") == listed

    # opt-in: every k down to the floor is probed on the unlimited mount too, none below;
    # measured with the fused path FastImageFolder trains with, for a link given by
    # --bandwidth (the mount has no limit): its epochs are then cold, as a bucket's are
    r = run_pcrfs("tune", m.mnt, "--workers", 2, "--sample", 40, "--transform", "fused",
                  "--min-fidelity", 8, "--dry-run", "--bandwidth", "4M")
    assert "transform fused" in r.stdout and "bandwidth limit 4194304" in r.stdout, r.stdout
    assert _end_to_end_regimes(r.stdout) == {"cold"}, r.stdout
    ks = {int(line.split()[1][1:]) for line in r.stdout.splitlines()
          if line.split()[:1] and line.split()[0] in ("0.0", "0.1", "0.5", "1.0")}
    assert "probe b" in r.stdout           # the fused path reads b_k as it reads q_k
    assert ks == set(range(8, stored["fidelity"] + 1)), r.stdout
    chosen = next(line for line in r.stdout.splitlines() if line.startswith("closed form"))
    assert int(chosen.split("mix_fidelity=")[1].split()[0]) >= 8, r.stdout
    for bad in (0, stored["fidelity"] + 1):
        r = run_pcrfs("tune", m.mnt, "--min-fidelity", bad, "--dry-run", check=False)
        assert r.returncode == 2 and f"--min-fidelity {bad}: this dataset has fidelities" in r.stderr
    assert json.loads((dst / "liquid.json").read_text()) == now


def test_tune_spreads_the_making_of_b_files_over_the_epochs(tmp_path, monkeypatch):
    """--epochs N: a b_k file is made once, on its first read, and kept in the disk cache,
    so a cold b_k finalist is measured over files made before its pass, and each pass is
    charged 1/N of the making the fit measured, on every core.  N = 1 (a single cold
    epoch, what the S3 bench measures): made in the pass, nothing added."""
    import pcrfs.liquid.search as search
    from pcrfs.liquid.sample import Sample
    from pcrfs.liquid.search import Tuner
    items = [(f"{i}.jpg", f"{i}.ppm") for i in range(70)]

    class S:
        mnt, path, total = str(tmp_path), Sample.path, 1000

        def passes(self, count, size):
            return [[(items[i * 10 + j], 0.0) for j in range(10)] for i in range(count)]
    loaded = []
    monkeypatch.setattr(search, "load", lambda paths, w: loaded.append(list(paths)))
    monkeypatch.setattr(search, "drop_pages", lambda p: None)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)

    def through(paths, prepare):
        for i in range(len(paths)):
            prepare(i)
        return [500.0] * (len(paths) - 1)
    # an untimed pass, then ROUNDS timed ones
    for epochs, made, rate in ((10, 4, 1 / (1 / 500 + 0.004 / (2 * 10))), (1, 0, 500.0)):
        t = Tuner.__new__(Tuner)
        t.sample, t.workers, t.limit, t.hold, t.pass_size = S(), 2, None, True, 10
        t.log, t.epochs, t.making = (lambda *_: None), epochs, {"b3": 0.004}
        t.decoders = type("D", (), {"through": staticmethod(through)})()
        loaded.clear()
        b3 = _probe(0.0, 3, 900, 800)
        b3.coding = "b"
        t.confirm([b3])
        assert sum(len(x) for x in loaded) == 10 * made        # made before each pass
        assert all("/b3/" in p for x in loaded for p in x)
        assert b3.regime == "cold" and b3.measured == pytest.approx(rate)
