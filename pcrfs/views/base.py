"""The View interface: what one top-level directory of a mount serves.

A view answers in paths relative to its own top (b"" is the top).  The filesystem layer
(fs/operations.py) only maps kernel requests onto these calls; a root (fs/root.py)
gives every view a tree id, hence its inode numbers.  lookup, list and xattrs run on the
trio thread and must be cheap (index lookups); read may block and runs in a worker thread.

`immutable` is a promise that a path's bytes and size never change while mounted: the
kernel may then cache pages and attributes, and the fast lane may open and serve the
view's files in C.  A view that breaks it (dynamic/, .pcrfs/) says so, gets direct I/O,
and reports a new `generation()` whenever what it serves changes."""
from __future__ import annotations

import errno
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol


class DataPlane(Protocol):
    """What a view may use of the open dataset (pcrfs.dataset.Dataset is one), and all it
    may use: tests/test_architecture.py checks that views read nothing else from it and
    assign nothing to it.  A view changes the mount's state only through carve() (its
    share of the memory budget) and add_tier() (a cache tier it owns, for stats)."""
    root: str                  # the dataset's location (a directory or a URL)
    uuid: object
    groups: int                # G: fidelities q1..qG
    index: object              # format/index.py IndexReader
    storage: object            # storage.Storage: record bytes, sidecars, raw packs
    stats: object              # telemetry/stats.py Stats
    served: dict               # name -> View, the views made so far
    mix_options: object        # liquid/rules.py MixOptions from the mount options

    def read_q(self, e, k: int, relpath: bytes) -> bytes: ...

    def pinned(self, view, e, produce) -> bytes: ...

    def universe(self, kind: str, k=None, load=None): ...

    def size_table(self) -> dict: ...

    def disk_cache(self, name: str): ...

    def carve(self, name: str, nbytes: int) -> int: ...

    def add_tier(self, name: str, tier) -> None: ...


class Entry(NamedTuple):
    is_dir: bool
    size: int             # a file's bytes, exact before any read (0 for a directory)
    ordinal: int          # node ordinal, unique within the view (fs/inodes.py)
    live: bool = False    # the size may change at any moment: attributes are never cached
    writable: bool = False


class Listing(NamedTuple):
    names: list[tuple[bytes, bool]]     # (name, is_dir), sorted by name bytes
    ords: Sequence[int]                  # node ordinal of each, in the same order
    sizes: dict[bytes, int] | None       # file sizes by name, when asked for and known


class Opened(NamedTuple):
    """What an open of a file reads: its bytes now (data), or a blocking call that
    produces them, bound at open time (a dynamic file keeps the fidelity it was opened
    with).  direct_io: no page cache (the bytes behind a path may change)."""
    data: bytes | None
    read: Callable[[], bytes] | None
    direct_io: bool


# What the fast lane can serve of a view's files in C (fs/daemon.py wires each kind to
# csrc/lane_cold.c): q-view JPEGs spliced from records, raw PPMs and mix files from the
# raw packs, l3 files from the transcode cache
LANE_Q, LANE_RAW, LANE_MIX, LANE_L3 = "q", "raw", "mix", "l3"


class View:
    name: str = ""
    immutable: bool = True
    lane_kind: str | None = None     # LANE_*: what the fast lane serves of it, if anything
    aliases = False                  # its files are other views' (serves_as), opened as those
    listed = True                    # in the mount's root listing (else reached by name only)

    def generation(self) -> int:
        """Changes whenever what the view serves changes (listings made before are stale)."""
        return 0

    def lookup(self, path: bytes) -> Entry | None:
        raise NotImplementedError

    def pending(self, path: bytes) -> Callable[[], object] | None:
        """Slow work that must be done, off the event loop, before path (or, for a
        directory, its entries) can be looked up without blocking; None when there is
        none.  Running it twice is harmless."""
        return None

    def list(self, path: bytes, sizes: bool = False) -> Listing:
        """A directory's entries.  FileNotFoundError / NotADirectoryError for a wrong path,
        ValueError if the data behind the listing is damaged."""
        raise NotImplementedError

    def read(self, path: bytes) -> bytes:
        """A file's bytes, verified.  Blocking: called from worker threads.  Damaged data
        raises CorruptDataError, never returns wrong bytes."""
        raise NotImplementedError

    def open(self, path: bytes) -> Opened:
        return Opened(None, lambda: self.read(path), not self.immutable)

    def xattrs(self, path: bytes) -> dict[bytes, bytes]:
        """Extended attributes of a file (user.* names)."""
        return {}

    def stats(self) -> dict:
        """Entries this view adds to .pcrfs/stats.json."""
        return {}

    def lane_counts(self, cold: dict[str, int], from_disk: bool) -> dict[str, int]:
        """What Python would have counted (Stats keys) for the files of this view the fast
        lane read cold (its per-view counters, kernel_shim.COLD): record segments and raw
        pack items; from_disk: the segments came from a remote dataset's disk tier."""
        images = cold["files"] - cold["pack_items"]
        return {"backend_bytes": cold["read_bytes"], "cache_misses": images,
                "raw_pack_reads": cold["pack_items"], "raw_pack_bytes": cold["pack_bytes"],
                "disk_cache_image_hits": images if from_disk else 0}

    def where(self, path: bytes) -> str:
        """Where a file's bytes come from, for error messages (e.g. "record 12")."""
        return ""

    def serves_as(self, path: bytes) -> View | None:
        """The view whose file of the same path this file is at the moment (dynamic/: the
        q view of the current fidelity), so an open can be bound to that file; None when
        the file is its own."""
        return None

    def write(self, path: bytes, data: bytes) -> list[View]:
        """Apply a complete value written to a writable file; returns the views whose
        served bytes changed (the kernel's cached attributes of their files are dropped).
        ValueError for a value the file does not take."""
        raise PermissionError(errno.EROFS, "read-only view")
