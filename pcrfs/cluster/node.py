"""This node's part of a cluster that mounts one bucket (`--shard i/p`, `--peers`).

- Ownership comes from pcrfs/cluster/shard.py, the rule the samplers use.  Owned records go into
  the disk tier under ShardPolicy (admitted, never evicted); the rest is refused there.
- `pcrfs warm MNT --view qk` (the control file control/warm) fetches every owned record's
  groups 1..k with one ranged GET per record, or only the groups a smaller earlier warm
  did not fetch, verifies every image's segments, keeps the extent in the disk tier and
  publishes the segments to this node's memcached (storage/peers.py).
- Reads of another node's record try its memcached first (`balance` = "peer", the
  default with --peers) or go straight to storage ("storage"); the locality-aware
  sampler sets this through control/balance.

The warm runs in a thread of its own; its progress is in stats.json ("shard")."""
from __future__ import annotations

import logging
import threading
import time

import numpy as np

from pcrfs.cluster.shard import Shard, ShardPolicy, owners
from pcrfs.errors import CorruptDataError
from pcrfs.format.checksum import segment_checksum
from pcrfs.format.index import INDEX_BITS
from pcrfs.storage.cache import Admission
from pcrfs.storage.peers import PeerCache
from pcrfs.views.qk import plan

log = logging.getLogger("pcrfs.cluster")
BALANCES = ("peer", "storage")


def record_counts(ds) -> dict[int, int]:
    """Images per record, from the index."""
    recs = ds.size_table()["ordinal"].astype(np.uint64) >> np.uint64(INDEX_BITS)
    r, n = np.unique(recs, return_counts=True)
    return {int(a): int(b) for a, b in zip(r, n, strict=False)}


class ShardNode:
    """This node of a --shard mount: the records it owns kept in its disk tier, `pcrfs
    warm`, its peers, and the balance the locality sampler reports."""

    def __init__(self, ds, shard: Shard, peers: PeerCache | None = None):
        self.ds = ds
        self.shard = shard
        self.peers = peers
        counts = record_counts(ds)
        self.owner = owners(counts, shard.nodes, shard.seed)
        self.owned = frozenset(r for r, o in self.owner.items() if o == shard.index)
        self.owned_images = sum(counts[r] for r in self.owned)
        self.policy = ShardPolicy(self.owned)
        self.balance = "peer" if peers is not None else "storage"
        self._lock = threading.Lock()
        self._warm: dict = {"state": "never"}
        self._thread: threading.Thread | None = None

    # -- the read path -----------------------------------------------------------------
    def is_owned(self, record: int) -> bool:
        return record in self.owned

    def peer_of(self, record: int) -> int | None:
        """The node whose memcached to ask for a record this node does not own."""
        if self.peers is None or self.balance != "peer":
            return None
        o = self.owner.get(record)
        return None if o is None or o == self.shard.index else o

    def set_balance(self, value: bytes | str) -> None:
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
        text = text.strip()
        if text not in BALANCES:
            raise ValueError(f"balance must be peer or storage, not {text!r}")
        if text == "peer" and self.peers is None:
            raise ValueError("balance peer needs a mount with --peers")
        if text != self.balance:
            log.info("balance %s -> %s", self.balance, text)
        self.balance = text

    # -- warm --------------------------------------------------------------------------
    def start_warm(self, k: int) -> None:
        """Warm the owned records at fidelity k in the background (ValueError if a warm
        is running)."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                raise ValueError("a warm is already running")
            self._warm = {"state": "running", "k": k, "records": len(self.owned), "done": 0,
                          "gets": 0, "bytes": 0, "reused": 0, "published": 0, "errors": [],
                          "started": time.time()}
            self._thread = threading.Thread(target=self._run_warm, args=(k,), daemon=True,
                                            name="pcrfs-warm")
            self._thread.start()

    def _progress(self, **kw) -> None:
        with self._lock:
            for key, v in kw.items():
                if key == "errors":
                    self._warm["errors"].append(v)
                else:
                    self._warm[key] = self._warm.get(key, 0) + v

    def _run_warm(self, k: int) -> None:
        try:
            images: dict[int, list] = {r: [] for r in self.owned}
            for _, e in self.ds.index.iter_images():
                if e.record in images:
                    images[e.record].append(e)
            for record in sorted(self.owned):
                try:
                    self._warm_record(record, k, images[record])
                except (CorruptDataError, OSError) as e:
                    log.error("warm: record %d: %s", record, e)
                    self._progress(errors=f"record {record}: {e}")
                self._progress(done=1)
            state = "done" if not self._warm["errors"] else "failed"
        except Exception as e:  # noqa: BLE001 - reported in stats, the mount keeps serving
            log.exception("warm failed")
            self._progress(errors=str(e))
            state = "failed"
        with self._lock:
            self._warm["state"] = state
            self._warm["seconds"] = round(time.time() - self._warm["started"], 3)

    def _warm_record(self, record: int, k: int, entries: list) -> None:
        storage = self.ds.storage
        disk = storage.disk
        offsets = self.ds.index.records[record]
        groups = len(offsets) - 1
        kk = min(k, groups)
        g0 = offsets[0]
        held = [j for j in range(groups, 0, -1)
                if disk.contains(storage._key(record, g0, offsets[j] - g0))]
        have = held[0] if held else 0
        old = None
        if have:
            old = disk.get(storage._key(record, g0, offsets[have] - g0))
            if old is None:
                have = 0
        if have >= kk:
            ext = old
            self._progress(reused=1)
        else:     # one ranged GET for the groups not yet held
            start = offsets[have]
            (new,) = storage._fetch(record, [(start, offsets[kk])])
            if len(new) != offsets[kk] - start:
                raise CorruptDataError(f"record {record} is shorter than its index")
            self._progress(gets=1, bytes=len(new))
            self.ds.stats.add(warm_gets=1, warm_bytes=len(new))
            ext = (bytes(old) + bytes(new)) if have else new
        top = max(have, kk)
        items = []
        for e in entries:      # every segment verified before it is kept or published
            p = plan(e, top, offsets)
            for (off, n), want in zip(p.segments, p.checksums, strict=True):
                seg = memoryview(ext)[off - g0 : off - g0 + n]
                if segment_checksum(seg) != want:
                    self.ds.stats.add(checksum_failures=1)
                    raise CorruptDataError(f"record {record}: segment at {off} (+{n}) fails "
                                           f"its checksum")
                items.append((off, n, seg))
        if have < kk:
            key = storage._key(record, g0, offsets[kk] - g0)
            disk.put(key, ext, Admission(record, None, record))
            if not disk.contains(key):
                raise OSError(f"the disk cache has no room for record {record} "
                              f"({len(ext)} bytes; --cache-dir-size)")
            if have:
                disk.forget(storage._key(record, g0, offsets[have] - g0))
        if self.peers is not None:
            self._progress(published=self.peers.publish(record, items))

    def status(self) -> dict:
        with self._lock:
            warm = {key: (list(v) if isinstance(v, list) else v) for key, v in self._warm.items()}
        return {"node": self.shard.index, "nodes": self.shard.nodes, "seed": self.shard.seed,
                "owned_records": len(self.owned), "owned_images": self.owned_images,
                "balance": self.balance, "warm": warm,
                "peers": self.peers.status() if self.peers is not None else []}
