"""Live files (.pcrfs/stats.json and the other counters).  Counter files have a steady
size: padded with newlines to a size that only grows, so that the size at GETATTR is the
size of what an OPEN then serves.  Under -o skip_open, once the lane has told the kernel
to stop sending OPEN, a live file is read by inode, and nothing marks where one reader's
file begins: each GETATTR renders it afresh and fixes its size; the READs after it serve
that very rendering."""
from __future__ import annotations

PAGE = 4096


class LiveFiles:
    def __init__(self):
        self._rendered: dict[int, bytes] = {}   # inode -> its rendering at the last GETATTR
        self._cap: dict[int, int] = {}          # inode -> the steady size of a counter file

    def render(self, ino: int, data: bytes, steady: bool) -> bytes:
        """Keep this rendering for the READs to come.  steady (counter files): padded with
        newlines to a size that only grows, in whole pages with room to spare: had the
        size changed between a reader's read() calls, it would get the start of one
        rendering and the end of another.  JSON ignores the trailing blank lines."""
        if steady:
            data = self._padded(ino, data)
        self._rendered[ino] = data
        return data

    def size(self, ino: int, n: int) -> int:
        """The steady size of a counter file whose rendering is n bytes long."""
        cap = self._cap.get(ino, 0)
        if n > cap:
            cap = self._cap[ino] = -(-(n * 3 // 2) // PAGE) * PAGE
        return cap

    def pad(self, ino: int, data: bytes) -> bytes:
        """data padded with newlines to its steady size, if ino is a counter file (one
        whose size a GETATTR has given).  Without -o skip_open, OPEN serves a rendering
        padded so: the size a reader stat()s is then the size it reads (tar, rsync),
        though counters moved in between."""
        return self._padded(ino, data) if ino in self._cap else data

    def _padded(self, ino: int, data: bytes) -> bytes:
        return data + b"\n" * (self.size(ino, len(data)) - len(data))

    def get(self, ino: int) -> bytes | None:
        return self._rendered.get(ino)
