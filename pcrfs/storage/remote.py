"""Records in object storage or behind a web server, with a local disk cache.

- Reads fetch exactly the planned byte ranges: adjacent segments are coalesced into one
  ranged GET, the others go out concurrently; no gap byte is ever fetched.
- Everything fetched goes into the disk cache (storage/diskcache.py: LRU, size-bounded,
  survives remounts, every entry checksummed), keyed by (record, offset, length): image
  segments from random readers, group extents from record-order readers.  The reader's
  in-memory LRU sits in front of it.
- `--bandwidth-limit` applies to network bytes only: disk-cache hits are free, which is
  the point of the cache.

open_remote() makes a local copy of the dataset's metadata (manifest, LMDB index, quality
report) under CACHE_DIR/<uuid>/meta, checked against the manifest's UUID, reused by a
remount, replaced atomically when the dataset at the URL changes."""
from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import tempfile
import uuid as uuidlib
from collections.abc import Sequence

from pcrfs.errors import CorruptDataError, DatasetError
from pcrfs.format import (
    EOI,
    INDEX_DIR,
    INDEX_FILE,
    MANIFEST,
    MUTABLE_META,
    OPTIONAL_META,
    record_key,
    record_name,
    sidecar_path,
)
from pcrfs.format.atomic import atomic_write
from pcrfs.format.checksum import segment_checksum
from pcrfs.format.manifest import check_fields, check_index_sum, read_manifest
from pcrfs.storage.diskcache import DiskCache
from pcrfs.storage.objclient import ObjectClient, RemoteAccessDenied, RemoteError, RemoteNotFound
from pcrfs.storage.throttle import TokenBucket
from pcrfs.telemetry.stats import Stats

log = logging.getLogger("pcrfs.remote")


def coalesce(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted [start, end) ranges with touching neighbours merged; gaps are kept."""
    out: list[list[int]] = []
    for s, e in sorted(ranges):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


class RemoteStorage:
    """A Storage (storage/__init__.py) over object storage, behind a disk tier."""

    def __init__(self, client: ObjectClient, disk: DiskCache | None, stats: Stats,
                 throttle: TokenBucket | None = None):
        self.client = client
        self.disk = disk
        self.stats = stats
        self.throttle = throttle
        self.node = None      # pcrfs/cluster/node.py ShardNode of a --shard mount

    def held_image(self, record: int) -> None:
        """An image served without a fetch (disk tier, or an extent held in memory)."""
        if self.node is not None and self.node.is_owned(record):
            self.stats.add(owned_hits=1)

    @staticmethod
    def _key(record: int, offset: int, length: int) -> str:
        return f"{record}:{offset}:{length}"

    def _disk_get(self, record: int, offset: int, length: int) -> bytes | None:
        if self.disk is None:
            return None
        data = self.disk.get(self._key(record, offset, length))
        if data is not None and len(data) == length:
            self.stats.add(disk_cache_hits=1)
            return data
        self.stats.add(disk_cache_misses=1)
        return None

    def _charge(self, got: Sequence[bytes]) -> None:
        """The bandwidth limit is charged for bytes that arrived, after they did, as a slow
        link delivers them: a store that is down transfers nothing, so a read's --io-timeout
        is never spent queuing for bandwidth it would not use."""
        if self.throttle:
            self.throttle.consume(sum(len(b) for b in got))

    def _fetch(self, record: int, ranges: list[tuple[int, int]]) -> list[bytes]:
        try:
            got = self.client.get_ranges(record_key(record), ranges)
        except RemoteNotFound:
            raise CorruptDataError(f"record {record_name(record)} is missing at "
                                   f"{self.client.describe(record_key(record))}") from None
        except RemoteError as e:
            raise CorruptDataError(f"record {record_name(record)}: {e}") from None
        self._charge(got)
        return got

    def splice(self, record: int, segments: Sequence[tuple[int, int]], akey=None,
               checksums: Sequence[int] | None = None) -> bytearray:
        """Segments (absolute offset, length) of a record followed by EOI.  akey: what the
        disk tier's admission decides on (the image's ordinal: all its segments alike).
        checksums (the index's, per segment): a segment from the disk tier or a peer that
        fails its own is dropped and read from the store instead (docs/SECURITY.md)."""
        parts: list[bytes | None] = [None] * len(segments)
        want = []
        for i, (off, n) in enumerate(segments):
            parts[i] = b"" if n == 0 else self._disk_get(record, off, n)
            if parts[i] is not None and n and checksums is not None \
                    and segment_checksum(parts[i]) != checksums[i]:
                self.disk.drop(self._key(record, off, n))
                self.stats.add(tier_damage_refetches=1)
                parts[i] = None
            if parts[i] is None:
                want.append((off, off + n))
        if not want:
            self.stats.add(disk_cache_image_hits=1)   # the whole image from the disk tier
            self.held_image(record)
        elif self.node is not None:
            want = self._from_peer(record, segments, parts, checksums)
        # one decision for the whole image: a tier filling up never keeps part of one
        keep = (self.disk is not None and bool(want)
                and self.disk.would_keep(akey, sum(e - s for s, e in want), len(want)))
        if want:
            got = iter(self.fetch_ranges(record, want))
            for i, (off, n) in enumerate(segments):
                if parts[i] is not None:
                    continue
                data = next(got)
                if len(data) != n:
                    raise CorruptDataError(f"record {record_name(record)} is shorter than its "
                                           f"index (segment at {off}, {n} bytes)")
                parts[i] = data
                if keep:   # its own bytes: a pending entry must not hold the whole range
                    self.disk.put_later(self._key(record, off, n), bytes(data), akey)
        parts.append(EOI)
        return bytearray().join(parts)

    def _from_peer(self, record: int, segments, parts: list, checksums=None
                   ) -> list[tuple[int, int]]:
        """Fill the missing parts that the owner's memcached holds (a --shard node reading
        another node's record); returns the ranges still wanted from storage.  A value that
        fails the index's checksum is a counted miss (peer_corrupt), read from storage."""
        owner = self.node.peer_of(record)
        missing = [(i, seg) for i, seg in enumerate(segments) if parts[i] is None]
        if owner is not None:
            got = self.node.peers.get(owner, record, [seg for _, seg in missing])
            for i, seg in missing:
                if seg not in got:
                    continue
                if checksums is not None and seg[1] and segment_checksum(got[seg]) != checksums[i]:
                    log.warning("peer value of record %d at %d (%d bytes) fails the index's "
                                "checksum; reading storage", record, *seg)
                    self.stats.add(peer_corrupt=1, peer_hits=-1, peer_misses=1,
                                   tier_damage_refetches=1)
                    continue
                parts[i] = got[seg]
        return [(off, off + n) for i, (off, n) in enumerate(segments) if parts[i] is None]

    def forget(self, record: int, group_offsets: Sequence[int], segments) -> bool:
        """Drop what the disk tier holds of record's extents and of these segments (their
        bytes failed a checksum after assembly); True: a re-read goes to the store."""
        if self.disk is not None:
            start = group_offsets[0]
            for end in group_offsets[1:]:
                self.disk.drop(self._key(record, start, end - start))
            for off, n in segments:
                self.disk.drop(self._key(record, off, n))
        return True

    def pread(self, record: int, offset: int, length: int, akey=None) -> bytes:
        """One extent; may come back short if the record is truncated.  akey: the disk
        tier's admission key (default: the record)."""
        akey = record if akey is None else akey
        data = self._disk_get(record, offset, length)
        if data is not None:
            return data
        (data,) = self._fetch(record, [(offset, offset + length)])
        if self.disk is not None and len(data) == length:
            self.disk.put_later(self._key(record, offset, length), data, akey)
        return data

    def fetch_ranges(self, record: int, ranges: Sequence[tuple[int, int]]) -> list[memoryview]:
        """Record ranges [start, end) from the store itself (not the disk tier), through the
        bandwidth limit, touching ones as one GET (an extent fetched in pieces)."""
        merged = coalesce(ranges)
        got = dict(zip(merged, self._fetch(record, merged), strict=True))
        out = []
        for s, e in ranges:      # a view of the GET that holds it: no copy
            ms, me = next(r for r in merged if r[0] <= s and e <= r[1])
            out.append(memoryview(got[(ms, me)])[s - ms : e - ms])
        return out

    def keep_extent(self, record: int, offset: int, data, akey=None) -> None:
        """An extent fetched in pieces, into the disk tier as pread() keeps one."""
        if self.disk is not None:
            self.disk.put_later(self._key(record, offset, len(data)), bytes(data),
                                record if akey is None else akey)

    def read_file(self, key: str, offset: int, length: int, akey=None, version: str = "",
                  fresh: bool = False) -> bytes:
        """Bytes of another dataset object (a raw pack), through the disk tier and the
        bandwidth limit; FileNotFoundError if there is no such object.  version names the
        object's content (a pack's XXH3 from raw.json): an object rewritten under the same
        key (materialize and push again) never meets ranges cached from the old one.
        fresh: from the store itself, neither taken from the disk tier nor put there."""
        dkey = f"{key}@{version}:{offset}:{length}"
        if self.disk is not None and not fresh:
            data = self.disk.get(dkey)
            if data is not None and len(data) == length:
                self.stats.add(disk_cache_hits=1)
                return data
        try:
            (data,) = self.client.get_ranges(key, [(offset, offset + length)])
        except RemoteNotFound:
            raise FileNotFoundError(errno.ENOENT, "no such object", self.client.describe(key)) from None
        except RemoteError as e:
            raise CorruptDataError(f"{key}: {e}") from None
        self._charge([data])
        if self.disk is not None and len(data) == length and not fresh:
            self.disk.put_later(dkey, data, key if akey is None else akey)
        return data

    def _extents_held(self, record: int, start: int, ends: Sequence[int]):
        """(i, key) of each extent [start, ends[i]) the disk tier holds, shortest first."""
        if self.disk is None:
            return
        for i, end in enumerate(ends):
            key = self._key(record, start, end - start)
            if self.disk.contains(key):
                yield i, key

    def cached_extent(self, record: int, start: int, ends: Sequence[int]) -> tuple[int, bytes] | None:
        """(i, extent [start, ends[i])) for the first end whose extent is on disk."""
        for i, key in self._extents_held(record, start, ends):
            data = self.disk.get(key)
            if data is not None and len(data) == ends[i] - start:
                self.stats.add(disk_cache_hits=1)
                return i, data
        return None

    def cached_segments(self, record: int, start: int, ends: Sequence[int], plan
                        ) -> bytearray | None:
        """An image's planned segments + EOI read by range from an extent [start, end) in
        the disk tier (the first of `ends` held): only the image's bytes are read, each
        segment verified.  A damaged entry is dropped (None: fetch it again)."""
        ranges = [(off - start, off - start + n) for off, n in plan.segments]
        for _, key in self._extents_held(record, start, ends):
            parts = self.disk.get_ranges(key, ranges)
            if parts is None:
                continue
            if any(segment_checksum(p) != want
                   for p, want in zip(parts, plan.checksums, strict=True)):
                self.disk.drop(key)
                continue
            self.stats.add(disk_cache_hits=1, disk_cache_image_hits=1)
            self.held_image(record)
            parts.append(EOI)
            return bytearray().join(parts)
        return None

    def sidecar(self, record: int) -> bytes:
        key = sidecar_path(record_key(record))
        cached = self.disk.get(key) if self.disk is not None else None
        if cached is not None:
            return cached
        try:
            data = self.client.get(key)
        except RemoteError as e:
            raise OSError(f"{e}") from None
        if self.disk is not None:
            self.disk.put(key, data)
        return data

    def close(self) -> None:
        if self.disk is not None:
            self.disk.close()   # pending entries reach the disk before the daemon exits


def fetch_metadata(client: ObjectClient, cache_dir: str) -> str:
    """The local metadata directory of the dataset at client.url (downloaded if needed).
    404/403 on the manifest become DatasetError naming the bucket and key."""
    try:
        raw = client.get(MANIFEST)
    except RemoteNotFound:
        raise DatasetError(f"{client.describe(MANIFEST)} does not exist: not a pcrfs dataset, "
                           f"or its build/push has not finished (the manifest is uploaded last)"
                           ) from None
    except RemoteError as e:
        raise DatasetError(f"cannot read the dataset manifest: {e}") from None
    try:
        manifest = json.loads(raw)
        uid = str(manifest["uuid"])
    except (ValueError, KeyError, TypeError):
        raise DatasetError(f"{client.describe(MANIFEST)}: not a pcrfs manifest") from None
    # every field checked before the uuid names a directory: a crafted "../victim" made
    # the rmtree and rename below reach outside the cache
    if not isinstance(manifest, dict):
        raise DatasetError(f"{client.describe(MANIFEST)}: not a pcrfs manifest")
    check_fields(manifest, client.describe(MANIFEST))
    uid = str(uuidlib.UUID(uid))
    if uid != manifest["uuid"]:
        raise DatasetError(f"{client.describe(MANIFEST)}: uuid {manifest['uuid']!r} is not in "
                           "its canonical form; the manifest is refused")
    meta = os.path.join(cache_dir, uid, "meta")
    try:
        kept = read_manifest(meta)
        if kept["uuid"] == uid:
            check_index_sum(meta, kept)     # a damaged copy is downloaded again
            log.info("metadata of %s reused from %s", client.describe(), meta)
            _refresh(client, meta)
            return meta
    except (DatasetError, KeyError):
        pass
    os.makedirs(os.path.dirname(meta), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".meta-", dir=os.path.dirname(meta))
    try:
        os.makedirs(os.path.join(tmp, INDEX_DIR))
        try:
            client.download(INDEX_FILE, os.path.join(tmp, INDEX_FILE))
        except RemoteNotFound:
            raise DatasetError(f"{client.describe(INDEX_FILE)} does not exist: the dataset at "
                               f"{client.describe()} is incomplete") from None
        except RemoteError as e:
            raise DatasetError(f"cannot download the index: {e}") from None
        try:   # the manifest's size and XXH3 of the index, before LMDB maps it
            check_index_sum(tmp, manifest)
        except DatasetError as e:
            raise DatasetError(f"{client.describe(INDEX_FILE)}: {e}") from None
        _check_index(os.path.join(tmp, INDEX_DIR), uid, client.describe(INDEX_FILE))
        for name in OPTIONAL_META:
            try:
                data = client.get(name)
            except RemoteNotFound:
                continue                # optional: this dataset has none
            except RemoteAccessDenied as e:
                # what S3 answers for a missing key to a reader without s3:ListBucket
                log.info("%s: taken as absent (%s)", name, e)
                continue
            except RemoteError as e:    # a 503 or a timeout is not "none": mix/ and raw/
                raise DatasetError(     # would serve defaults without a word
                    f"cannot download {client.describe(name)}: {e}") from None
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(data)
        with open(os.path.join(tmp, MANIFEST), "wb") as f:  # last: marks the copy complete
            f.write(raw)
        shutil.rmtree(meta, ignore_errors=True)
        os.rename(tmp, meta)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("metadata of %s downloaded to %s", client.describe(), meta)
    return meta


def _refresh(client: ObjectClient, meta: str) -> None:
    """Fetch MUTABLE_META again into a reused metadata copy; one the store no longer has is
    removed.  If the store cannot be asked, the copy stays as it was (and says so)."""
    for name in MUTABLE_META:
        path = os.path.join(meta, name)
        try:
            data = client.get(name)
        except RemoteNotFound:
            if os.path.exists(path):
                os.unlink(path)
                log.info("%s is gone from the store: dropped", name)
            continue
        except RemoteError as e:
            log.warning("cannot refresh %s (%s): using the copy in %s", name, e, meta)
            continue
        with atomic_write(path, durable=False, tmp=f"{path}.{os.getpid()}.tmp") as f:
            f.write(data)


def _check_index(path: str, uid: str, where: str) -> None:
    """A downloaded index must open and belong to the manifest's dataset; anything else
    (a truncated object, a proxy that mangled it) is refused now, with its origin."""
    from pcrfs.format.index import IndexReader
    size = os.path.getsize(os.path.join(path, "data.mdb"))
    try:
        reader = IndexReader(path)
    except Exception as e:  # noqa: BLE001 - lmdb raises its own error classes
        raise DatasetError(f"{where}: not a valid pcrfs index ({size} bytes downloaded: "
                           f"{e})") from None
    try:
        if reader.meta.get("uuid") != uid:
            raise DatasetError(f"{where} belongs to dataset {reader.meta.get('uuid')}, the "
                               f"manifest says {uid}: the dataset is being replaced; retry")
    finally:
        reader.close()
