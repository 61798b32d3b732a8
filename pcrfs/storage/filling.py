"""An extent fetched piece by piece, the pieces waiting readers need first (`-o fetch=record`).

A shuffled cold epoch asks for images anywhere in a record.  Fetched as one request, the
first image of a record waits for the whole extent (groups 1..k of every image in it) and
nothing is decoded while it arrives: on a 400-image record at 5 MB/s, 1.06 s of a 1.64 s
epoch went by before the first batch.  Here each group is cut into pieces.  One fetcher
thread takes the extent in order, in batches of about BATCH_SECONDS of transfer at the
rate it has measured (so a store with a high first-byte latency still gets large GETs),
and between batches fetches first the pieces a reader waits for (one or two per group
for an image).  A reader waits for its own pieces only, the link stays busy, and the
loaders decode what has arrived.  The bytes are those of one extent read.

When every piece is in, the caller gets the whole extent (on_done), as from one read."""
from __future__ import annotations

import threading
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Sequence

from pcrfs.errors import CorruptDataError

PIECES = 16            # per group: an image waits for about 1/16 of each group
MIN_PIECE = 16 << 10   # smaller pieces cost a request each for little
BATCH_SECONDS = 0.1    # an in-order batch: the longest a waiting reader's pieces queue
MIN_BATCH = 256 << 10  # the first batch, before any rate is known


def cut(ends: Sequence[int], pieces: int = PIECES, min_piece: int = MIN_PIECE) -> list[tuple[int, int]]:
    """[start, end) pieces covering [0, ends[-1]): each group [ends[g-1], ends[g]) (the
    first from 0) in at most `pieces` near-equal parts of at least `min_piece` bytes."""
    out, s = [], 0
    for e in ends:
        if e > s:
            n = max(1, min(pieces, (e - s) // min_piece))
            at = [s + j * (e - s) // n for j in range(n + 1)]
            out += list(zip(at, at[1:], strict=False))
        s = max(s, e)
    return out


class FillingExtent:
    """fetch(ranges) -> [bytes]: the extent-relative ranges, fetched together (touching
    ones as one GET, the others concurrently); a short or failed fetch fails every reader
    still waiting for its pieces, with that error, and ends the fill (the caller drops
    this object, a later read starts again).  on_done(self) runs once on the fetcher
    thread when every piece is in; on_end(self) after it, or after the error, last."""

    def __init__(self, size: int, pieces: list[tuple[int, int]],
                 fetch: Callable[[list[tuple[int, int]]], list[bytes]],
                 on_done: Callable[[FillingExtent], None], start: bool = True,
                 on_end: Callable[[FillingExtent], None] | None = None):
        self.buf = bytearray(size)
        self.pieces = pieces
        self._starts = [s for s, _ in pieces]
        self._done = [False] * len(pieces)
        self._left = len(pieces)
        self._wanted: deque[int] = deque()
        self._next = 0
        self._batch = MIN_BATCH
        self._cond = threading.Condition()
        self._fetch, self._on_done, self._on_end = fetch, on_done, on_end
        self.error: BaseException | None = None
        if start:
            self.start()

    def start(self) -> None:
        threading.Thread(target=self._run, name="pcrfs-fill", daemon=True).start()

    @property
    def complete(self) -> bool:
        return self._left == 0

    def _covering(self, ranges: Sequence[tuple[int, int]]) -> list[int]:
        found = []
        for s, e in ranges:
            i = max(0, bisect_right(self._starts, s) - 1)
            while i < len(self.pieces) and self.pieces[i][0] < e:
                if self.pieces[i][1] > s:
                    found.append(i)
                i += 1
        return found

    def wait(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Until the extent-relative ranges are in buf; raises the fill's error if one of
        their pieces never came."""
        need = self._covering(ranges)
        with self._cond:
            missing = [i for i in need if not self._done[i]]
            if not missing:
                return
            self._wanted.extend(missing)
            self._cond.notify_all()
            while self.error is None and any(not self._done[i] for i in missing):
                self._cond.wait()
            if any(not self._done[i] for i in missing):
                raise self.error

    def _take(self) -> tuple[list[int], bool]:
        """The pieces wanted now (all of them, fetched together), else the next pieces in
        order up to the batch size; and whether these are in order."""
        with self._cond:
            batch = list(dict.fromkeys(i for i in self._wanted if not self._done[i]))
            self._wanted.clear()
            if batch:
                return batch, False
            while self._next < len(self.pieces) and self._done[self._next]:
                self._next += 1
            size, i = 0, self._next
            while i < len(self.pieces) and not self._done[i] and (not batch or size < self._batch):
                batch.append(i)
                size += self.pieces[i][1] - self.pieces[i][0]
                i += 1
            return batch, True

    def _run(self) -> None:
        try:
            self._fill()
        finally:
            if self._on_end is not None:
                self._on_end(self)

    def _fill(self) -> None:
        while True:
            batch, in_order = self._take()
            if not batch:
                break
            want = [self.pieces[i] for i in batch]
            t0 = time.monotonic()
            try:
                got = self._fetch(want)
                for (s, e), data in zip(want, got, strict=True):
                    if len(data) != e - s:
                        raise CorruptDataError(f"extent piece [{s}, {e}) came back with "
                                               f"{len(data)} bytes (the record is short)")
            except BaseException as e:      # every waiter gets it; the fill ends here
                with self._cond:
                    self.error = e
                    self._cond.notify_all()
                return
            if in_order:    # the next batch: about BATCH_SECONDS at this batch's rate
                rate = sum(e - s for s, e in want) / max(time.monotonic() - t0, 1e-4)
                self._batch = max(MIN_BATCH, int(rate * BATCH_SECONDS))
            with self._cond:
                for i, (s, e), data in zip(batch, want, got, strict=True):
                    self.buf[s:e] = data     # same length: safe beside readers' exports
                    self._done[i] = True
                    self._left -= 1
                self._cond.notify_all()
        self._on_done(self)
