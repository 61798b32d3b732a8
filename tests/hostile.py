"""Crafting hostile datasets with pcrfs's own format writers (tests/test_hostile.py): every
checksum the format carries is valid, as an attacker who has the writers would make it."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from pcrfs.builder.indexer import add_to_tree, listing_heads
from pcrfs.format import INDEX_DIR, MANIFEST, SEGTAB
from pcrfs.format.index import (
    IndexReader,
    write_index,
)
from pcrfs.format.manifest import SELF_SUM, metadata_sums, write_json_atomic


def reseal(ds: Path, **manifest_fields) -> None:
    """The manifest rewritten with these fields and the current metadata's sums, its own
    checksum valid; the derived segment table dropped (it names the old index)."""
    m = json.loads((ds / MANIFEST).read_text())
    m.pop(SELF_SUM, None)
    m.update(manifest_fields)
    m["files"] = {**m.get("files", {}), **metadata_sums(str(ds))}
    write_json_atomic(str(ds / MANIFEST), m, self_sum=True)
    (ds / SEGTAB).unlink(missing_ok=True)


def rewrite_index(ds: Path, rename: dict[bytes, bytes] | None = None, patch=None) -> None:
    """ds's index written again with image paths renamed and each raw entry value passed
    through patch(path, value) -> value, then the manifest resealed."""
    rename = rename or {}
    r = IndexReader(str(ds / INDEX_DIR))
    try:
        meta = dict(r.meta)
        records = dict(r.records)
        entries = []
        with r.env.begin() as txn:
            for k, v in txn.cursor(r._db[b"images"]):
                path = rename.get(bytes(k), bytes(k))
                entries.append((path, patch(path, bytes(v)) if patch else bytes(v)))
    finally:
        r.close(wait=True)
    listings: dict = {b"": set()}
    for p, _ in entries:
        add_to_tree(listings, p)
    tree = {d: sorted(c) for d, c in listings.items()}
    shutil.rmtree(ds / INDEX_DIR)
    write_index(str(ds / INDEX_DIR), meta, entries, tree, records, listing_heads(tree, entries))
    reseal(ds)


def copy_dataset(ds: Path, to: Path) -> Path:
    shutil.copytree(ds, to, symlinks=True)
    os.chmod(to, 0o755)
    return to
