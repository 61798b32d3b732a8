"""Inode numbers: assigned at build time (tree << 56 | node ordinal), unique by
construction in every view, stable across remounts and `pcrfs reindex`; an index built
before node ordinals existed is refused with the command that upgrades it."""
import os
import shutil

import lmdb
import numpy as np

import pcrfs
from pcrfs.format.index import DIR_BIT, ORDINALS

from conftest import run_pcrfs


def _all_ordinals(ds, view: str) -> np.ndarray:
    """Every node's ordinal in `view`, computed by the functions the mount uses."""
    out, todo = [DIR_BIT], [b""]
    while todo:
        d = todo.pop()
        names, ords, _ = ds.listdir_numbered(d, view)
        out.extend(ords)
        todo.extend((d + b"/" + n if d else n) for n, is_dir in names if is_dir)
    return np.array(out, dtype=np.uint64)


def test_unique_in_every_view_of_a_million_entries(tmp_path):
    """make soak: a million files in 1,000 directories; make test: a quarter of that
    (the same paths through the index, a quarter of the time)."""
    from testkit.synthetic import build_synthetic
    classes = int(os.environ.get("PCRFS_INODES_CLASSES", "250"))
    build_synthetic(str(tmp_path / "big"), classes=classes, per_class=1000)
    ds = pcrfs.open_dataset(str(tmp_path / "big"))
    assert ds.index.numbered
    seen = None
    # every kind of view once (the q views share one listing code path)
    views = [ds.views[0], ds.views[-1], *ds.format_views]
    for view in views:
        ords = _all_ordinals(ds, view)
        assert len(ords) == classes * 1000 + classes + 1, view
        assert len(np.unique(ords)) == len(ords), f"{view}: two nodes share an inode"
        if seen is None:
            seen = ords
        else:    # the same node numbers in every view (inode = view's tree << 56 | ordinal)
            assert np.array_equal(np.sort(ords), np.sort(seen)), view
    assert int(seen.max()) < 1 << 56
    # a lookup agrees with the listing; the stored runs agree with the entries
    mid = f"c{classes // 2:05d}".encode()
    names, ords, _ = ds.listdir_numbered(mid, "q3")
    for j in (0, 499, 999):
        assert ds.file_node(mid + b"/" + names[j][0], "q3")[1] == ords[j]
    for d in (b"c00000", f"c{classes // 2:05d}".encode(), f"c{classes - 1:05d}".encode()):
        listing, _, runs = ds.index.dir_numbering(d)
        walked = ds.index.files_in_dir(d, 1)
        assert runs is not None and len(runs) == len(listing)
        assert runs == [walked[n][0] for n, _ in listing]
    ds.close()


def test_shuffled_build_numbers_alike_without_runs(small_src, tmp_path):
    """--shuffle-seed scatters a directory's files over records: no runs are stored and
    the listing reads the entries; the numbers are the same either way."""
    run_pcrfs("build", small_src, tmp_path / "ds", "-q", "--images-per-record", 2,
              "--shuffle-seed", "7")
    ds = pcrfs.open_dataset(str(tmp_path / "ds"))
    listing, _, runs = ds.index.dir_numbering(b"c0")
    assert runs is None
    names, ords, _ = ds.listdir_numbered(b"c0", "q2")
    assert ords == [ds.file_node(b"c0/" + n, "q2")[1] for n, _ in names]
    assert len(set(_all_ordinals(ds, "q1"))) == len(_all_ordinals(ds, "q1")) == 24 + 3 + 1
    ds.close()


def _inodes_through_mount(mnt) -> dict[str, int]:
    out = {}
    for d, dirs, files in os.walk(mnt):
        if ".pcrfs" in dirs:
            dirs.remove(".pcrfs")
        for n in dirs + files:
            p = os.path.join(d, n)
            out[os.path.relpath(p, mnt)] = os.stat(p).st_ino
    return out


def test_unique_through_the_kernel_and_stable_across_reindex(edge_ds, tmp_path, mount):
    """Every view of the edge-case dataset (deep trees, stem collisions in l3/, long
    names): st_ino unique across the whole mount, d_ino equal to st_ino, and the same
    numbers after `pcrfs reindex` and a remount."""
    ds = tmp_path / "ds"
    shutil.copytree(edge_ds, ds)
    m = mount(ds)
    before = _inodes_through_mount(m.mnt)
    assert len(set(before.values())) == len(before)
    for d in ("q1", "l3", "dynamic"):
        with os.scandir(m.mnt / d) as it:
            for e in it:
                assert e.inode() == e.stat().st_ino, e.path
    m.__exit__(None, None, None)
    run_pcrfs("reindex", ds)
    m2 = mount(ds, mnt=tmp_path / "again")
    assert _inodes_through_mount(m2.mnt) == before


def test_index_without_node_numbers_is_refused_until_reindexed(small_src, tmp_path, mount):
    ds = tmp_path / "ds"
    run_pcrfs("build", small_src, ds, "-q", "--images-per-record", 8)
    env = lmdb.open(str(ds / "index.lmdb"), max_dbs=4, subdir=True, lock=False)
    meta = env.open_db(b"meta")
    with env.begin(write=True) as txn:    # what an index of an older pcrfs lacks
        assert txn.delete(ORDINALS.encode(), db=meta)
    env.close()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = run_pcrfs("mount", ds, mnt, check=False)
    assert r.returncode != 0 and not os.path.ismount(mnt)
    assert "pcrfs reindex" in r.stderr, r.stderr
    run_pcrfs("reindex", ds)
    m = mount(ds)
    assert len(list((m.mnt / "q1" / "c0").iterdir())) == 8
