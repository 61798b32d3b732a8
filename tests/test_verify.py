"""`pcrfs verify` vouches for every byte of a dataset: a flipped byte in any kind of file
the dataset holds is caught, and a damaged l3 sidecar item costs only its own image."""
import os
import shutil
from pathlib import Path

import pytest

from conftest import run_pcrfs


def _kind(rel: str) -> str:
    """A dataset file's kind: records by suffix, everything else by name."""
    name = os.path.basename(rel)
    return os.path.splitext(name)[1] if rel.startswith("records/") else name


@pytest.fixture(scope="module")
def full_ds(tmp_path_factory) -> Path:
    """A dataset holding every kind of file pcrfs writes (records, l3 sidecars, index,
    the lane's table file, manifest, build report, quality report)."""
    from PIL import Image

    from edgecases import photo_like
    root = tmp_path_factory.mktemp("verify")
    for i in range(24):
        d = root / "src" / f"c{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(photo_like(96 + i, 64 + i, i)).save(d / f"im{i:02d}.jpg", quality=90)
    ds = root / "ds"
    run_pcrfs("build", root / "src", ds, "--images-per-record", 8, "-q")
    run_pcrfs("info", ds, "--quality", "--sample", "3")
    return ds


def _files(ds: Path) -> dict[str, str]:
    out = {}
    for d, _, fs in os.walk(ds):
        for f in sorted(fs):
            rel = os.path.relpath(os.path.join(d, f), ds)
            out.setdefault(_kind(rel), rel)
    return out


def _flip(path: Path, at: int | None = None) -> int:
    data = bytearray(path.read_bytes())
    at = len(data) // 2 if at is None else at
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    return at


def test_healthy_dataset_verifies_and_every_kind_is_checked(full_ds):
    kinds = _files(full_ds)
    assert {".pcr", ".l3m", "data.mdb", "manifest.json", "build-report.json",
            "quality.json", "index.segtab"} <= set(kinds), kinds
    out = run_pcrfs("verify", full_ds).stdout
    assert out.rstrip().endswith("OK") and "note:" not in out, out
    checked = out.split("files checked: ")[1].splitlines()[0]
    for kind in kinds:     # verify read every kind the dataset holds
        assert kind.lstrip(".") in checked, (kind, checked)


@pytest.mark.parametrize("kind", [".pcr", ".l3m", "data.mdb", "manifest.json",
                                  "build-report.json", "quality.json", "index.segtab"])
def test_a_flipped_byte_in_any_file_kind_fails_verify(full_ds, tmp_path, kind):
    ds = tmp_path / "ds"
    shutil.copytree(full_ds, ds)
    kinds = _files(ds)
    _flip(ds / kinds[kind])
    p = run_pcrfs("verify", ds, check=False)
    assert p.returncode == 1, (kind, p.stdout, p.stderr)
    assert "PROBLEM" in p.stdout or "DAMAGED" in p.stdout, p.stdout


def test_every_kind_the_dataset_holds_is_covered_above(full_ds):
    """A new kind of file (a future sidecar) must join the parametrized flip test."""
    covered = {".pcr", ".l3m", "data.mdb", "manifest.json", "build-report.json", "quality.json",
               "index.segtab"}
    assert set(_files(full_ds)) == covered


@pytest.mark.parametrize("field,offset", [("size", 0), ("xxh", 6)])
def test_damaged_sidecar_item_costs_only_its_image(full_ds, tmp_path, mount, field, offset):
    """Verify names exactly the one image; the mount serves every other l3 file of the
    record.  A damaged checksum makes that one file EIO; a damaged size is redundant at
    mount (the index holds the size, the intact checksum still vouches for the bytes).
    The mount gets a cache dir of its own: a transcode an earlier mount of this dataset
    kept (checked against the intact sidecar then) would be served from its entry."""
    import pcrfs
    from pcrfs.format.l3meta import HEAD, ITEM
    ds = tmp_path / "ds"
    shutil.copytree(full_ds, ds)
    _flip(ds / "records" / "r000000.l3m", HEAD.size + 3 * ITEM.itemsize + offset)
    p = run_pcrfs("verify", ds, check=False)
    damaged = [ln for ln in p.stdout.splitlines() if ln.startswith("DAMAGED")]
    assert p.returncode == 1 and len(damaged) == 1 and "item 3" in damaged[0], p.stdout
    bad = damaged[0].split()[1].rstrip(":")
    ref = pcrfs.open_dataset(str(full_ds))
    m = mount(ds, "--cache-dir", tmp_path / "cache")
    n_ok = 0
    for path, e in ref.index.iter_images():
        if e.record != 0:
            continue
        l3name = os.path.splitext(os.fsdecode(path))[0] + ".l3"
        if os.fsdecode(path) == bad and field == "xxh":
            with pytest.raises(OSError) as err:
                (m.mnt / "l3" / l3name).read_bytes()
            assert err.value.errno == 5
        else:
            assert (m.mnt / "l3" / l3name).read_bytes() == ref.read(l3name, "l3")
            n_ok += 1
    assert n_ok == (7 if field == "xxh" else 8)
    fails = m.stats()["checksum_failures"]  # the sidecar once, then the image (per try)
    assert (fails >= 2) if field == "xxh" else (fails == 1)
    ref.close()


def test_reindex_keeps_the_manifest_vouching_for_the_index(full_ds, tmp_path):
    ds = tmp_path / "ds"
    shutil.copytree(full_ds, ds)
    run_pcrfs("reindex", ds)
    out = run_pcrfs("verify", ds).stdout
    assert out.rstrip().endswith("OK"), out
