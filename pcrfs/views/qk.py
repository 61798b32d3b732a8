"""The q_k view: an image's scan segments 1..k plus EOI, a valid progressive JPEG.

Images with fewer than k scans (grayscale has 6) are served complete."""
from __future__ import annotations

from dataclasses import dataclass

from pcrfs.format.index import ImageEntry


@dataclass(frozen=True)
class ReadPlan:
    record: int
    segments: tuple[tuple[int, int], ...]  # (absolute offset in record, length)
    checksums: tuple[int, ...]
    size: int                              # bytes of the assembled file


@dataclass(frozen=True)
class QView:
    k: int

    @property
    def name(self) -> str:
        return f"q{self.k}"

    def size(self, e: ImageEntry) -> int:
        return e.size_at(self.k)

    def plan(self, e: ImageEntry, group_offsets: list[int]) -> ReadPlan:
        n = min(self.k, e.scans)
        lengths = e.lengths()
        segs = tuple((group_offsets[g] + e.offsets[g], lengths[g]) for g in range(n))
        return ReadPlan(e.record, segs, e.checksums[:n], e.size_at(self.k))


def parse_view(name: str, groups: int) -> QView:
    if name.startswith("q") and name[1:].isdigit() and 1 <= int(name[1:]) <= groups:
        return QView(int(name[1:]))
    raise KeyError(f"no view {name!r} (views: q1..q{groups})")
