"""Which node owns which records: one rule shared by the daemon (`--shard i/p`) and the
samplers (pcrfs.torch.locality), so no cache directory is ever exchanged.

Records are ordered by a seeded hash and dealt out by cumulative image count: a record
goes to the node whose 1/p-th of the images its middle image falls in.  Every node then
owns a deterministic set of whole records whose image counts differ from N/p by less than
one record, and a node's share does not depend on which other nodes are up."""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from pcrfs.format.index import INDEX_BITS
from pcrfs.storage.cache import Admission, Policy, ranks

_SALT = 0x5EED_0F_5AAD


@dataclass(frozen=True)
class Shard:
    """This node's part: node `index` of `nodes`, under `seed`."""
    index: int
    nodes: int
    seed: int = 0

    def __str__(self) -> str:
        return f"{self.index}/{self.nodes}"


def parse_shard(text: str, seed: int = 0) -> Shard:
    """'i/p' (0 <= i < p) -> Shard; ValueError with the reason otherwise."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not m:
        raise ValueError(f"--shard {text!r}: expected i/p, e.g. 0/4")
    i, p = int(m.group(1)), int(m.group(2))
    if p < 1 or not 0 <= i < p:
        raise ValueError(f"--shard {text}: need 0 <= i < p")
    return Shard(i, p, int(seed))


def owners(counts: Mapping[int, int], nodes: int, seed: int = 0) -> dict[int, int]:
    """record -> owning node, for records with `counts[record]` images each."""
    if nodes < 1:
        raise ValueError("nodes must be at least 1")
    recs = np.array(sorted(counts), dtype=np.uint64)
    if not len(recs):
        return {}
    n = np.array([counts[int(r)] for r in recs], dtype=np.float64)
    order = np.argsort(ranks(recs ^ np.uint64((_SALT + 0x9E37 * int(seed)) & (2**64 - 1))),
                      kind="stable")
    n_sorted = n[order]
    middle = np.cumsum(n_sorted) - n_sorted / 2
    node = np.minimum((middle * nodes / max(n.sum(), 1)).astype(np.int64), nodes - 1)
    return {int(recs[j]): int(node[i]) for i, j in enumerate(order)}


def owned(counts: Mapping[int, int], shard: Shard) -> set[int]:
    """The records node shard.index owns."""
    return {r for r, o in owners(counts, shard.nodes, shard.seed).items() if o == shard.index}


def counts_of(records) -> dict[int, int]:
    """record -> images, from one record number per image."""
    out: dict[int, int] = {}
    for r in records:
        out[int(r)] = out.get(int(r), 0) + 1
    return out


class ShardPolicy(Policy):
    """A disk tier's policy on a `--shard` node: it admits the bytes of owned records
    and never evicts them (the paper's cache without replacement); anything else (other
    nodes' records, which their peers serve) is refused."""
    name = "shard"
    evicts = False

    def __init__(self, records: set[int]):
        self.records = frozenset(records)

    def record_of(self, akey) -> int | None:
        if isinstance(akey, Admission):
            if akey.record is not None:
                return akey.record
            akey = akey.key
        return akey >> INDEX_BITS if isinstance(akey, int) else None   # an image ordinal

    def admits(self, akey) -> bool:
        return self.record_of(akey) in self.records
