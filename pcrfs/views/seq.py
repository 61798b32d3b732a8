"""The b_k views: each image's q_k file re-coded as one sequential (baseline) scan.

A q_k file is a progressive JPEG cut after scan k.  Decoders pay for that: libjpeg keeps
every coefficient of the image, walks each scan in turn and smooths the blocks of a cut
file, so Pillow decodes q5 at about the cost of the full baseline source although it
holds half the bytes.  b_k holds the same coefficients as one baseline-coded scan
(csrc/transcode.c, pcr_sequential): each coefficient's missing low bits move into its
quantizer, so the file is no larger than q_k and decodes in one Huffman pass.  Its pixels
are q_k's decoded without block smoothing (libjpeg's estimate of the missing AC terms);
b_G is pixel for pixel the source.  Names are the source's, as in q_k.

The bytes are made from q_k's (every segment checksum verified) on the file's first
lookup, in a worker thread, and kept in the view's disk cache across epochs and remounts;
a file's size is known once it has been made, so a lookup makes it (View.pending).  The
rendering is deterministic: a file made again after an eviction has the size it had.

Every b_k is reached by name on every mount (`pcrfs tune` probes them there); the root
lists only those of -o seq=, else the one `pcrfs tune` chose, so `du MNT` or `ls -lR MNT`
never makes a whole view of them unasked."""
from __future__ import annotations

from pcrfs import native
from pcrfs.errors import CorruptDataError
from pcrfs.format.index import ImageEntry
from pcrfs.native import NativeError
from pcrfs.singleflight import SingleFlight
from pcrfs.views.tree import TreeView

PREFIX = "b"


class SeqView(TreeView):
    def __init__(self, ds, k: int, cache=None, listed: bool = True):
        super().__init__(ds)
        self.listed = listed
        self.k = k
        self.name = f"{PREFIX}{k}"
        self.cache = cache
        self._flight = SingleFlight()
        # node ordinal -> bytes, for the files made so far: ordinals are record << 24 |
        # index, so a table indexed by them would be sized by the record count times 2^24
        self._sizes: dict[int, int] = {}

    # -- sizes ---------------------------------------------------------------------
    def known(self, ordinal: int) -> int | None:
        return self._sizes.get(ordinal)

    def file_size(self, e: ImageEntry) -> int | None:
        return self.known(e.ordinal)

    def pending(self, path: bytes):
        """A file not made yet is made before its lookup answers (its size is its length);
        a directory lists without the sizes of files not made yet."""
        if not path or self.index.dir_ordinals(path) is not None:
            return None
        try:
            e = self.entry(path)
        except FileNotFoundError:
            return None
        if self.known(e.ordinal) is not None:
            return None
        return lambda: self.produce(path, e)

    def files_in_dir(self, path: bytes) -> dict[bytes, tuple[int, int | None]]:
        return {n: (o, self.known(o)) for n, (o, _) in self.index.files_in_dir(path, self.k).items()}

    def sizes_in_dir(self, path: bytes) -> dict[bytes, int]:
        return {n: s for n, (_, s) in self.files_in_dir(path).items() if s is not None}

    # -- bytes -----------------------------------------------------------------------
    def cache_key(self, ordinal: int) -> str:
        return f"{self.name}:{ordinal}"

    def produce(self, path: bytes, e: ImageEntry) -> bytes:
        """Concurrent first reads of one file share a single rendering."""
        return self._flight.do(e.ordinal, lambda: self._render(path, e))

    def _render(self, path: bytes, e: ImageEntry) -> bytes:
        want = self.known(e.ordinal)
        key = self.cache_key(e.ordinal)
        if self.cache is not None:
            data = self.cache.get(key)
            if data is not None and (want is None or len(data) == want):
                self.ds.stats.add(transcode_cache_hits=1)
                return self._learn(e, data)
        try:
            # no larger than the index says the image is: a crafted header claiming more
            # would have libjpeg buffer coefficients for all of it
            data = native.sequential(self.ds.read_q(e, self.k, path),
                                     max(1, e.width) * max(1, e.height))
        except NativeError as err:     # verified bytes libjpeg refuses: the image's error
            raise CorruptDataError(f"{path.decode(errors='replace')}: {err}") from None
        self.ds.stats.add(transcodes=1)
        if want is not None and len(data) != want:
            raise CorruptDataError(f"{path.decode(errors='replace')}: rendered {len(data)} "
                                   f"bytes, {want} before")
        if self.cache is not None:
            self.cache.put_later(key, data)
        return self._learn(e, data)

    def _learn(self, e: ImageEntry, data: bytes) -> bytes:
        self._sizes[e.ordinal] = len(data)       # one dict store: atomic under the GIL
        return data

    def scans(self, e: ImageEntry) -> int:
        return min(self.k, e.scans)

    def xattrs(self, path: bytes) -> dict[bytes, bytes]:
        return super().xattrs(path) | {b"user.pcrfs.format": b"jpeg-sequential"}
