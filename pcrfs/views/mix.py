"""The mix view: each image exactly once, as PPM when the raw rule picks it at share R
(pcrfs/liquid/rules.py), else as its qk JPEG under its own name.  R and k are fixed for the
life of the mount, so names and sizes never change.  A raw file takes the raw view's
name (foo.jpg -> foo.ppm), so ImageFolder finds the same classes, class_to_idx and
number of samples as over qG.

bulk() renders .pcrfs/mix.tsv: every file's format, hold membership and record, so a
sampler reads one file instead of one getxattr per image."""
from __future__ import annotations

import errno
import os

import numpy as np

from pcrfs.control import MIX_TSV
from pcrfs.format.index import ImageEntry
from pcrfs.liquid.rules import ppm_size, raw_mask, tsv_escape
from pcrfs.storage.cache import MemoryTier, rank
from pcrfs.views.base import LANE_MIX
from pcrfs.views.raw import SUFFIX, RawSource, sizes_of
from pcrfs.views.tree import TreeView, format_names

NAME = "mix"
BULK = MIX_TSV.encode()


class MixView(TreeView):
    name = NAME
    lane_kind = LANE_MIX

    def __init__(self, ds, source: RawSource, share: float, k: int, direct: bool = False):
        super().__init__(ds)
        self.src = source
        self.share, self.k = float(share), int(k)
        self.immutable = not direct
        self._maps = MemoryTier(256, sizeof=lambda v: 1)   # dir -> (fwd, rev) name maps

    # -- names ---------------------------------------------------------------------
    def _dir_maps(self, parent: bytes) -> tuple[dict[bytes, bytes], dict[bytes, bytes]]:
        found = self._maps.get(parent)
        if found is not None:
            return found
        files = self.index.dims_in_dir(parent, self.k)
        names = list(files)
        ords = np.array([files[n][0] for n in names], dtype=np.uint64)
        raw = raw_mask(ords, self.share) if len(names) else []
        ppm = format_names(names, SUFFIX)
        fwd = {n: (ppm[n] if r else n) for n, r in zip(names, raw, strict=True)}
        found = (fwd, {v: k for k, v in fwd.items()})
        self._maps.put(parent, found)
        return found

    def rename(self, path, src):
        fwd, _ = self._dir_maps(path)
        return sorted((n if d else fwd[n], d) for n, d in src)

    def source_name(self, parent: bytes, name: bytes) -> bytes:
        return self._dir_maps(parent)[1][name]

    def entry(self, path: bytes) -> ImageEntry:
        parent, _, name = path.rpartition(b"/")
        src = self._dir_maps(parent)[1].get(name)
        e = None if src is None else self.index.lookup(parent + b"/" + src if parent else src)
        if e is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", os.fsdecode(path))
        return e

    # -- sizes -----------------------------------------------------------------------
    def file_size(self, e: ImageEntry) -> int:
        return ppm_size(e.width, e.height) if self._raw(e) else e.size_at(self.k)

    def _raw(self, e: ImageEntry) -> bool:
        return bool(raw_mask([e.ordinal], self.share)[0])

    def files_in_dir(self, path):
        files = self.index.dims_in_dir(path, self.k)
        fwd, _ = self._dir_maps(path)
        return {n: (o, ppm_size(w, h) if fwd[n] != n else qk) for n, (o, qk, w, h) in files.items()}

    def sizes_in_dir(self, path: bytes) -> dict[bytes, int]:
        files = self.files_in_dir(path)
        fwd, _ = self._dir_maps(path)
        return {fwd[n]: size for n, (_, size) in files.items()}

    def universe(self, tier: str):
        def load():
            t = self.ds.size_table()
            raw = raw_mask(t["ordinal"], self.share)
            return t["ordinal"], np.where(raw, sizes_of(t), t["ends"][:, self.k - 1] + 2)
        return self.ds.universe(NAME, (tier, self.share, self.k), load)

    # -- bytes -----------------------------------------------------------------------
    def produce(self, path: bytes, e: ImageEntry) -> bytes:
        parent, _, name = path.rpartition(b"/")
        src = self._dir_maps(parent)[1][name]
        srcpath = parent + b"/" + src if parent else src
        raw = self._raw(e)

        def make():
            return self.src.ppm(e, srcpath) if raw else self.ds.read_q(e, self.k, srcpath)
        return self.src.held(NAME, e, self.universe("hold"), make)

    def xattrs(self, path: bytes) -> dict[bytes, bytes]:
        e = self.entry(path)
        return super().xattrs(path) | {b"user.pcrfs.format": b"ppm" if self._raw(e) else b"jpeg"}

    def scans(self, e: ImageEntry) -> int:
        return min(self.k, e.scans)

    def stats(self) -> dict:
        return {"mix": {"share": self.share, "fidelity": self.k}}

    # -- the bulk file -------------------------------------------------------------------
    def held_cut(self) -> float:
        """Rank below which an image's mix file is in the hold (0: no hold)."""
        hold = self.src.hold
        return 0.0 if hold is None else self.universe("hold").cut(hold.capacity)

    def bulk(self) -> bytes:
        """path<TAB>format<TAB>held<TAB>record<TAB>index, one line per file, by path; a
        backslash, tab or newline in a path is written \\\\, \\t, \\n."""
        cut = self.held_cut()
        rows = []
        for src, e in self.index.iter_images():
            parent, _, name = src.rpartition(b"/")
            mixname = self._dir_maps(parent)[0][name]
            path = parent + b"/" + mixname if parent else mixname
            held = rank(e.ordinal) < cut
            fmt = b"ppm" if mixname != name else b"jpeg"
            rows.append(b"%s\t%s\t%d\t%d\t%d\n" % (tsv_escape(path), fmt, held, e.record,
                                                 e.index))
        rows.sort()
        return b"# path\tformat\theld\trecord\tindex\n" + b"".join(rows)
