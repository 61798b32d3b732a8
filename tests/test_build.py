"""`pcrfs build` on real photographs and generated edge cases, read back through
open_dataset: full fidelity is pixel-identical, every qk decodes, sizes grow with k."""
import io
import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from PIL import Image

import pcrfs
from pcrfs.errors import DatasetError, PcrfsError

from conftest import run_pcrfs
from edgecases import edge_cases

Image.MAX_IMAGE_PIXELS = None


def pixels(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        return np.array(im)


def djpeg_ok(data: bytes, scale: str = "1/8") -> None:
    p = subprocess.run(["djpeg", "-scale", scale, "-strict"], input=data, capture_output=True)
    assert p.returncode == 0 and p.stdout.startswith((b"P5", b"P6")), p.stderr


def image_paths(ds, rel=b""):
    for name, is_dir in ds.listdir(rel):
        path = rel + b"/" + name if rel else name
        if is_dir:
            yield from image_paths(ds, path)
        else:
            yield path


def test_corpus_full_fidelity_is_pixel_identical(corpus_src, corpus_ds):
    ds = pcrfs.open_dataset(str(corpus_ds))
    jpegs = [p for p in image_paths(ds) if p.endswith(b".jpg")]
    assert len(jpegs) >= 50
    identical = 0
    for p in jpegs:
        src = (corpus_src / os.fsdecode(p)).read_bytes()
        identical += np.array_equal(pixels(src), pixels(ds.read(p, ds.views[-1])))
    report = json.loads((corpus_ds / "build-report.json").read_text())
    print(f"pixel-identical at q{ds.groups}: {identical}/{len(jpegs)} corpus JPEGs")
    assert identical == len(jpegs)
    assert report["skipped"] == [] and len(report["converted"]) >= 40  # the PNGs


def test_corpus_every_view_decodes_and_grows(corpus_ds):
    ds = pcrfs.open_dataset(str(corpus_ds))

    def decodes(data: bytes, pillow: bool) -> None:     # djpeg is a process, Pillow drops the GIL
        djpeg_ok(data)          # -strict: a corrupt-data warning fails it, as Pillow's would not
        if pillow:
            with Image.open(io.BytesIO(data)) as im:
                im.draft(im.mode, (im.width // 8, im.height // 8))
                im.load()

    with ThreadPoolExecutor(max(2, os.cpu_count() or 1)) as pool:
        for i, p in enumerate(image_paths(ds)):
            sizes = [ds.stat(p, v).size for v in ds.views]
            assert sizes == sorted(sizes) and sizes[0] < sizes[-1]
            jobs = []
            for k, v in enumerate(ds.views):
                data = ds.read(p, v)
                assert len(data) == ds.stat(p, v).size
                assert data[:2] == b"\xff\xd8" and data[-2:] == b"\xff\xd9"
                # Pillow too for one view of each image, every view in turn over the corpus
                jobs.append(pool.submit(decodes, data, k == i % len(ds.views)))
            for j in jobs:
                j.result()


def test_corpus_size_summary_and_ratio(corpus_ds):
    info = json.loads(run_pcrfs("info", corpus_ds, "--json").stdout)
    views = info["summary"]["views"]
    assert [v["view"] for v in views] == [f"q{k}" for k in range(1, info["groups"] + 1)]
    assert views[0]["full_over_k"] > 3 and views[-1]["full_over_k"] == 1.0
    text = run_pcrfs("info", corpus_ds).stdout
    assert "max I/O speedup" in text and "bytes per image" in text


def test_edge_cases_outcomes(edge_src, edge_ds):
    report = json.loads((edge_ds / "build-report.json").read_text())
    skipped = {s["path"]: s["reason"] for s in report["skipped"]}
    converted = set(report["converted"])
    ds = pcrfs.open_dataset(str(edge_ds))
    for rel, (data, expect) in edge_cases().items():
        name = os.fsdecode(rel)
        if expect == "skipped":
            assert name in skipped and skipped[name], name
            with pytest.raises(FileNotFoundError):
                ds.lookup(rel)
            continue
        assert name not in skipped, (name, skipped.get(name))
        assert (name in converted) == (expect == "converted"), name
        full = ds.read(rel, ds.views[-1])
        if expect == "jpeg":
            assert np.array_equal(pixels(data), pixels(full)), name
        for v in ds.views:
            out = ds.read(rel, v)
            Image.open(io.BytesIO(out)).load()
            djpeg_ok(out, "1/1")
    assert skipped["stray_top_level.jpg"] == "not inside a class directory"
    assert "12" in skipped["bad/twelve_bit.jpg"] and "empty" in skipped["bad/empty.jpg"]
    assert "Premature end" in skipped["bad/truncated.jpg"]


def test_edge_case_scan_counts_and_padding(edge_ds):
    ds = pcrfs.open_dataset(str(edge_ds))
    assert ds.groups == 18  # CMYK: the largest scan count sets G
    gray = ds.lookup(b"jpeg/grayscale.jpg")
    assert gray.scans == 6 and gray.components == 1
    # Fewer scans than k: served complete, byte for byte.
    assert ds.read(b"jpeg/grayscale.jpg", "q6") == ds.read(b"jpeg/grayscale.jpg", "q18")
    assert ds.lookup(b"jpeg/cmyk.jpg").scans == 18
    assert ds.lookup(b"jpeg/baseline_420.jpg").scans == 10


def test_file_names_keep_their_exact_bytes(edge_ds):
    ds = pcrfs.open_dataset(str(edge_ds))
    names = {n for n, _ in ds.listdir(b"names")}
    assert {b"with space.jpg", "ünïcödé ✓.jpg".encode(), b"latin1_\xe9\xff.jpg", b"deep"} == names
    assert ds.listdir(b"names/deep/er") == [(b"nested.jpg", False)]
    assert ds.stat(b"names/deep", "q1").is_dir


def test_labels_follow_imagefolder_order(edge_ds):
    ds = pcrfs.open_dataset(str(edge_ds))
    # torchvision's ImageFolder: sorted top-level directory names, label = position.
    assert ds.classes == ["bad", "jpeg", "names", "other"]
    assert ds.lookup(b"jpeg/cmyk.jpg").label == 1
    assert ds.lookup(b"other/image.bmp").label == 3
    assert [n for n, d in ds.listdir(b"") if d] == [b"bad", b"jpeg", b"names", b"other"]


def test_strict_fails_naming_the_files(edge_src, tmp_path):
    p = run_pcrfs("build", edge_src, tmp_path / "ds", "--strict", "-q", check=False)
    assert p.returncode != 0
    assert "bad/truncated.jpg" in p.stderr and "bad/empty.jpg" in p.stderr
    assert not (tmp_path / "ds").exists() and not (tmp_path / "ds.partial").exists()


def test_keep_metadata_all_keeps_exif(edge_src, tmp_path):
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    (src / "e.jpg").write_bytes(edge_cases()[b"jpeg/exif_thumbnail.jpg"][0])
    for policy, has_exif in (("default", False), ("all", True)):
        run_pcrfs("build", src.parent, tmp_path / policy, "--keep-metadata", policy, "-q")
        ds = pcrfs.open_dataset(str(tmp_path / policy))
        assert (b"Exif" in ds.read(b"c/e.jpg", "q1")) == has_exif


def test_shuffle_seed_changes_record_membership_not_content(small_src, tmp_path):
    run_pcrfs("build", small_src, tmp_path / "a", "--images-per-record", 5, "-q")
    run_pcrfs("build", small_src, tmp_path / "b", "--images-per-record", 5, "-q",
              "--shuffle-seed", 7)
    a, b = pcrfs.open_dataset(str(tmp_path / "a")), pcrfs.open_dataset(str(tmp_path / "b"))
    paths = list(image_paths(a))
    assert [a.lookup(p).record for p in paths] == sorted(a.lookup(p).record for p in paths)
    assert [b.lookup(p).record for p in paths] != [a.lookup(p).record for p in paths]
    for p in paths:
        assert a.read(p, "q3") == b.read(p, "q3")


def test_scan_script_file(small_src, tmp_path):
    script = tmp_path / "three.scans"
    script.write_text("# DC, then all AC of luma, then all AC of chroma\n"
                      "0,1,2: 0-0, 0, 0;\n0: 1-63, 0, 0;\n1: 1-63, 0, 0;\n2: 1-63, 0, 0;\n")
    run_pcrfs("build", small_src, tmp_path / "ds", "--scans", script, "-q")
    ds = pcrfs.open_dataset(str(tmp_path / "ds"))
    assert ds.groups == 4 and ds.views == ["q1", "q2", "q3", "q4"]
    p = next(image_paths(ds))
    assert np.array_equal(pixels((small_src / os.fsdecode(p)).read_bytes()),
                          pixels(ds.read(p, "q4")))
    bad = tmp_path / "bad.scans"
    bad.write_text("0,1,2: 0-0, 0;")
    r = run_pcrfs("build", small_src, tmp_path / "ds2", "--scans", bad, "-q", check=False)
    assert r.returncode == 2 and "scan script" in r.stderr


def test_export_writes_plain_files(edge_ds, tmp_path):
    out = tmp_path / "q3"
    r = run_pcrfs("export", edge_ds, "q3", out)
    ds = pcrfs.open_dataset(str(edge_ds))
    files = [p for p in image_paths(ds)]
    assert f"exported {len(files)} files" in r.stdout
    for p in files:
        assert open(os.path.join(os.fsencode(out), p), "rb").read() == ds.read(p, "q3")
    bad = run_pcrfs("export", edge_ds, "q99", tmp_path / "x", check=False)
    assert bad.returncode == 2 and "no view" in bad.stderr


def test_a_kill_while_starting_never_leaves_an_unresumable_partial(small_src, tmp_path, monkeypatch):
    """DST.partial appears only with its state file: a build dying between creating the
    directory and writing the state (simulated here) leaves nothing --resume would refuse."""
    from pcrfs.builder import resume
    from pcrfs.builder.builder import BuildOptions, build
    dst = tmp_path / "ds"
    real = resume.write_json_atomic

    def die(path, *a, **kw):
        if path.endswith(resume.STATE):
            raise KeyboardInterrupt("killed")
        return real(path, *a, **kw)
    monkeypatch.setattr(resume, "write_json_atomic", die)
    with pytest.raises(KeyboardInterrupt):
        build(str(small_src), str(dst), BuildOptions(progress=False))
    assert not (tmp_path / "ds.partial").exists()
    monkeypatch.setattr(resume, "write_json_atomic", real)
    build(str(small_src), str(dst), BuildOptions(progress=False, resume=True))
    assert pcrfs.open_dataset(str(dst)).manifest["images"] > 0
    assert not (tmp_path / "ds.partial.new").exists()


def _views_and_manifest(dst):
    m = json.loads((dst / "manifest.json").read_text())
    for k in ("uuid", "created", "xxh3", "files"):
        m.pop(k)
    ds = pcrfs.open_dataset(str(dst))
    files = [c + b"/" + n for c, _ in ds.listdir(b"") for n, d in ds.listdir(c) if not d]
    return m, {(v, p): ds.read(p, v) for p in files for v in ds.views}


def test_a_killed_writers_temporary_is_neither_counted_nor_kept(small_src, tmp_path,
                                                                 monkeypatch):
    """A SIGKILL in the middle of writing a record leaves its PATH.tmp (atomic_write never
    got to remove it).  Found by make soak: the resumed dataset's dataset_bytes counted it.
    The finished dataset must equal an uninterrupted build's, without the temporary."""
    from pcrfs.builder import publish
    from pcrfs.builder.builder import BuildOptions, build
    ref = tmp_path / "ref"
    build(str(small_src), str(ref), BuildOptions(progress=False, images_per_record=4))
    want_manifest, want_views = _views_and_manifest(ref)

    def killed(*a, **kw):
        raise KeyboardInterrupt("killed before the index")
    monkeypatch.setattr(publish, "build_index", killed)
    dst = tmp_path / "ds"
    with pytest.raises(KeyboardInterrupt):
        build(str(small_src), str(dst), BuildOptions(progress=False, images_per_record=4))
    monkeypatch.undo()
    records = tmp_path / "ds.partial" / "records"
    (records / "r000001.pcr.tmp").write_bytes(os.urandom(70_000))   # a redo, cut short
    build(str(small_src), str(dst), BuildOptions(progress=False, images_per_record=4,
                                                 resume=True))
    assert _views_and_manifest(dst) == (want_manifest, want_views)
    assert sorted(os.listdir(dst / "records")) == sorted(os.listdir(ref / "records"))


@pytest.mark.parametrize("step", ["index", "report", "manifest", "notes removed",
                                  "state removed", "rename"])
def test_killed_in_each_last_step_resumes_to_the_same_dataset(small_src, tmp_path, monkeypatch, step):
    """The steps after the last record, each interrupted right after it happened (the
    timing-based SIGKILL test hits them only by chance): --resume finishes the dataset."""
    import shutil

    from pcrfs.builder import publish
    from pcrfs.builder.builder import BuildOptions, build
    ref = tmp_path / "ref"
    build(str(small_src), str(ref), BuildOptions(progress=False, images_per_record=4))
    want_manifest, want_views = _views_and_manifest(ref)
    opts = BuildOptions(progress=False, images_per_record=4)

    def after(obj, name, when):
        real = getattr(obj, name)

        def wrapper(*a, **kw):
            out = real(*a, **kw)
            if when(*a):
                raise KeyboardInterrupt(f"killed after {step}")
            return out
        monkeypatch.setattr(obj, name, wrapper)
    if step == "index":
        after(publish, "build_index", lambda *a: True)
    elif step in ("report", "manifest"):
        name = "build-report.json" if step == "report" else "manifest.json"
        after(publish, "write_json_atomic", lambda path, *a: path.endswith(name))
    elif step == "notes removed":
        after(shutil, "rmtree", lambda path, *a: path.endswith(publish.SKIPPED_DIR))
    elif step == "state removed":
        after(publish, "fsync_dir", lambda path: path.endswith(".partial"))
    else:
        monkeypatch.setattr(publish, "rename", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
    dst = tmp_path / "ds"
    with pytest.raises(KeyboardInterrupt):
        build(str(small_src), str(dst), opts)
    assert not dst.exists() and (tmp_path / "ds.partial").exists()
    with pytest.raises(DatasetError):
        pcrfs.open_dataset(str(dst))
    monkeypatch.undo()
    with pytest.raises(PcrfsError, match="--resume"):
        build(str(small_src), str(dst), opts)
    res = build(str(small_src), str(dst), BuildOptions(progress=False, images_per_record=4, resume=True))
    assert res.images == want_manifest["images"]
    assert _views_and_manifest(dst) == (want_manifest, want_views)
    assert sorted(os.listdir(dst)) == sorted(os.listdir(ref))
    assert not (tmp_path / "ds.partial").exists()


def test_overwrite_removes_the_replaced_datasets_metadata(tmp_path):
    """A remote build with --overwrite replaces another dataset: its raw.json, liquid.json
    and quality.json go with its manifest (a new dataset that inherited them refused to
    mount, or served the old raw share and fidelity)."""
    from pcrfs.builder.plan import BuildOptions
    from pcrfs.builder.resume import open_remote
    from pcrfs.format import AFTER_BUILD_META, MANIFEST
    from pcrfs.jobs.stores import LocalStore
    work = LocalStore(str(tmp_path / "prefix"))
    work.write(MANIFEST, b'{"uuid": "old"}')
    for key in AFTER_BUILD_META:
        work.write(key, b'{"uuid": "old"}')
    state = {"plan_hash": "x", "params": {}, "records": 1}
    with pytest.raises(PcrfsError, match="--overwrite"):
        open_remote(work, BuildOptions(), state)
    assert work.size(MANIFEST) is not None and work.size("liquid.json") is not None
    open_remote(work, BuildOptions(overwrite=True), state)
    assert {k: work.size(k) for k in (MANIFEST, *AFTER_BUILD_META)} == \
        dict.fromkeys((MANIFEST, *AFTER_BUILD_META))
