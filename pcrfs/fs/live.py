"""-o skip_open's live files (.pcrfs/stats.json and the other counters): once the lane
has told the kernel to stop sending OPEN, a live file is read by inode, and nothing marks
where one reader's file begins.  Each GETATTR renders it afresh and fixes its size; the
READs after it serve that very rendering."""
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
            cap = self._cap.get(ino, 0)
            if len(data) > cap:
                cap = self._cap[ino] = -(-(len(data) * 3 // 2) // PAGE) * PAGE
            data += b"\n" * (cap - len(data))
        self._rendered[ino] = data
        return data

    def get(self, ino: int) -> bytes | None:
        return self._rendered.get(ino)
