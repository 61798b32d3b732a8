"""The q_k view: an image's scan segments 1..k plus EOI, a valid progressive JPEG.

Images with fewer than k scans (grayscale has 6) are served complete."""
from __future__ import annotations

from dataclasses import dataclass

from pcrfs.errors import CorruptDataError
from pcrfs.format.index import ImageEntry
from pcrfs.views.base import LANE_Q
from pcrfs.views.tree import TreeView


@dataclass(frozen=True)
class ReadPlan:
    record: int
    segments: tuple[tuple[int, int], ...]  # (absolute offset in record, length)
    checksums: tuple[int, ...]
    size: int                              # bytes of the assembled file


def plan(e: ImageEntry, k: int, group_offsets: list[int]) -> ReadPlan:
    """CorruptDataError (EIO for this file alone) where the entry claims bytes outside its
    record's groups: an index is untrusted input, and a crafted entry claiming 4 GiB had
    the daemon allocate it (docs/SECURITY.md)."""
    n = min(k, e.scans)
    lengths = e.lengths()
    if n > len(group_offsets) - 1 or any(
            lengths[g] < 0 or e.offsets[g] < 0
            or e.offsets[g] + lengths[g] > group_offsets[g + 1] - group_offsets[g]
            for g in range(n)):
        raise CorruptDataError(f"image {e.index} of record {e.record}: its index entry claims "
                               "bytes outside its record's scan groups")
    segs = tuple((group_offsets[g] + e.offsets[g], lengths[g]) for g in range(n))
    return ReadPlan(e.record, segs, e.checksums[:n], e.size_at(k))


class QView(TreeView):
    lane_kind = LANE_Q

    def __init__(self, ds, k: int):
        super().__init__(ds)
        self.k = k
        self.name = f"q{k}"

    def file_size(self, e: ImageEntry) -> int:
        return e.size_at(self.k)

    def plan(self, e: ImageEntry, group_offsets: list[int]) -> ReadPlan:
        return plan(e, self.k, group_offsets)

    def files_in_dir(self, path: bytes) -> dict[bytes, tuple[int, int | None]]:
        return self.index.files_in_dir(path, self.k)

    def sizes_in_dir(self, path: bytes) -> dict[bytes, int]:
        return self.index.sizes_in_dir(path, self.k)

    def universe(self, tier: str):
        return self.ds.universe("file", self.k) if tier == "memory" else None

    def produce(self, path: bytes, e: ImageEntry) -> bytes:
        return self.ds.read_q(e, self.k, path)

    def scans(self, e: ImageEntry) -> int:
        return min(self.k, e.scans)


def parse_view(name: str, groups: int) -> int:
    """'q5' -> 5; KeyError for anything but q1..qG."""
    if name.startswith("q") and name[1:].isdigit() and 1 <= int(name[1:]) <= groups:
        return int(name[1:])
    raise KeyError(f"no view {name!r} (views: q1..q{groups})")
