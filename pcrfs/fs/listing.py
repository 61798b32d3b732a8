"""Which directory entries carry attributes: pyfuse3's missing READDIRPLUS_AUTO.

pyfuse3 answers every readdir with READDIRPLUS and turns the kernel's adaptive mode off, so
by default the kernel builds a dentry and inode for every file listed, and the daemon keeps
a lookup count for it.  For a listing nobody stats (ImageFolder's scan, os.walk, find) that
is most of the cost.  A readdirplus entry whose node id is 0 is passed to the caller (name,
d_ino, d_type) but not instantiated (fs/fuse/readdir.c, fuse_direntplus_link), which is
the plain-readdir cost.  pyfuse3's EntryAttributes sets the node id and st_ino together,
so a "bare" entry is written through ctypes at the field offsets, after checking them once
at start (`BareEntries.probe`); if the layout is not the expected one, every entry keeps
its attributes.

The policy (`ListingPolicy`, mode "auto"): directories always get attributes (few, and
path walks need them); files are bare until a listing is followed by lookups of its files
(ls -l, du, tar, cp -r stat what they list).  From then on, listings give attributes
until HOLD seconds pass without such evidence.  Modes "yes"/"no" pin it either way."""
from __future__ import annotations

import ctypes
import time
from collections import OrderedDict

MODES = ("auto", "yes", "no")


class BareEntries:
    """Zero the node id of a pyfuse3.EntryAttributes while keeping attr.st_ino (d_ino)."""

    def __init__(self):
        self.offset = self.probe()

    @staticmethod
    def probe() -> int | None:
        """Offset of fuse_entry_param.ino inside the object, or None if the layout is not
        the one expected (a different pyfuse3 build): then no entry is ever made bare."""
        import pyfuse3  # here, so that `pcrfs mount` can fork before importing it
        a = pyfuse3.EntryAttributes()
        sentinel = 0x5C3A_11D0_7E6B_0F21
        a.st_ino = sentinel
        raw = ctypes.string_at(id(a), type(a).__basicsize__)
        hits = [i for i in range(0, len(raw) - 7, 8)
                if int.from_bytes(raw[i:i + 8], "little") == sentinel]
        if len(hits) != 2:      # fuse_param.ino, then attr.st_ino
            return None
        ctypes.c_uint64.from_address(id(a) + hits[0]).value = 0
        if a.st_ino != 0:       # the getter reads fuse_param.ino
            return None
        a.st_ino = 7
        if int.from_bytes(ctypes.string_at(id(a) + hits[1], 8), "little") != 7:
            return None
        return hits[0]

    def nodeid_slot(self, a) -> ctypes.c_uint64 | None:
        """A view of `a`'s node id; valid while `a` lives."""
        return None if self.offset is None else ctypes.c_uint64.from_address(id(a) + self.offset)


class ListingPolicy:
    WINDOW = 2.0     # s after a bare listing during which lookups of its files are stats
    EVIDENCE = 8     # such lookups in one directory that turn attributes on
    HOLD = 5.0       # s attributes stay on after the last evidence
    TRACKED = 64     # bare-listed directories remembered

    def __init__(self, mode: str = "auto", clock=time.monotonic):
        if mode not in MODES:
            raise ValueError(f"readdirplus={mode!r}: expected one of {', '.join(MODES)}")
        self.mode = mode
        self.clock = clock
        self._recent: OrderedDict[int, list] = OrderedDict()   # dir inode -> [listed at, hits]
        self._plus_until = 0.0
        self.switches = 0        # times evidence turned attributes on

    def files_plus(self) -> bool:
        """Should the listing starting now give its files attributes?"""
        if self.mode != "auto":
            return self.mode == "yes"
        return self.clock() < self._plus_until

    def listed_bare(self, dir_ino: int) -> None:
        """A chunk of bare file entries of this directory went to the kernel."""
        r = self._recent.pop(dir_ino, None)
        self._recent[dir_ino] = [self.clock(), r[1] if r else 0]
        if len(self._recent) > self.TRACKED:
            self._recent.popitem(last=False)

    def looked_up(self, parent_ino: int) -> None:
        """A file was looked up in this directory."""
        r = self._recent.get(parent_ino)
        if r is None:
            return
        now = self.clock()
        if now - r[0] > self.WINDOW:
            del self._recent[parent_ino]
            return
        r[1] += 1
        if r[1] >= self.EVIDENCE:
            if now >= self._plus_until:
                self.switches += 1
            self._plus_until = now + self.HOLD
