"""The peer cache: each node's memcached holds the image segments of the records it owns
(`--shard`), and the other nodes read them there before going to storage.

- Owners publish when they warm (pcrfs/cluster/node.py): one value per image segment (a long
  one in pieces of PIECE bytes), keyed by dataset, record, offset and length, so a reader
  asks for exactly the k segments of the image it assembles, in one get_many round trip.
- Every value carries a check of its bytes: with `--peer-key` (a secret the nodes share) a
  keyed BLAKE2b-128 MAC of its key and bytes, so a memcached that anyone on the network
  can write cannot forge a segment; without one, the XXH3-64 of its bytes (damage only).
  The caller verifies the index's segment checksums as well.  A damaged or forged value
  is a miss (counted), read from storage, never served.
- A peer that refuses, times out or is flushed is a miss that falls back to storage.  A
  dead peer is not asked again for a back-off period, so a training step does not wait on
  a connect timeout per image.
- `--peer-bandwidth-limit` throttles the bytes received from peers (the interconnect).

Why memcached: docs/CLUSTER.md."""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
import struct
import threading
import time
from collections.abc import Sequence

import xxhash

from pcrfs.errors import PcrfsError
from pcrfs.storage.throttle import TokenBucket
from pcrfs.telemetry.stats import Stats

log = logging.getLogger("pcrfs.peers")
CHECK = struct.Struct("<Q")
PIECE = 512 << 10         # longer segments are stored in pieces: memcached's items are
                          # at most 1 MiB by default (-I), whole pages above 512 KiB
TIMEOUT = 0.5              # seconds: a peer on the same fabric answers in well under 1 ms
BACKOFF = (1.0, 30.0)      # first and longest pause before a dead peer is asked again


def parse_peers(text: str) -> list[tuple[str, int]]:
    """'host:port,host:port' or '@FILE' (one host:port per line, # comments) -> list,
    node i's memcached at position i."""
    if text.startswith("@"):
        try:
            with open(text[1:]) as f:
                items = [ln.split("#", 1)[0].strip() for ln in f]
        except OSError as e:
            raise PcrfsError(f"--peers {text}: {e.strerror}") from None
    else:
        items = [s.strip() for s in text.split(",")]
    out = []
    for item in filter(None, items):
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise PcrfsError(f"--peers: {item!r} is not host:port")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise PcrfsError(f"--peers {text!r}: no peers")
    return out


def pieces(off: int, n: int) -> list[tuple[int, int]]:
    """A segment as the (offset, length) pieces it is stored in."""
    return [(o, min(PIECE, off + n - o)) for o in range(off, off + n, PIECE)] or [(off, 0)]


MAC_SIZE = 16
KEY_MIN = 16


def read_key(path: str) -> bytes:
    """The cluster's peer secret: PcrfsError unless the file holds at least KEY_MIN bytes
    and only its owner can read it (a key others can read authenticates nothing)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            key = f.read(1 << 16).strip()
    except OSError as e:
        raise PcrfsError(f"--peer-key {path}: {e.strerror}") from None
    if mode & 0o077:
        raise PcrfsError(f"--peer-key {path}: readable by others (mode {mode & 0o777:o}); "
                         "chmod 600 it")
    if len(key) < KEY_MIN:
        raise PcrfsError(f"--peer-key {path}: {len(key)} bytes; at least {KEY_MIN} are "
                         "needed (head -c 32 /dev/urandom | base64 > FILE)")
    return key


def _mac(key: bytes, name: str, data) -> bytes:
    h = hashlib.blake2b(key=key if len(key) <= 64 else hashlib.blake2b(key).digest(),
                        digest_size=MAC_SIZE, person=b"pcrfs-peer")
    h.update(name.encode())        # bound to its key: a value cannot stand in for another
    h.update(b"\0")
    h.update(data)
    return h.digest()


def seal(data, key: bytes | None = None, name: str = "") -> bytes:
    if key is not None:
        return _mac(key, name, data) + bytes(data)
    return CHECK.pack(xxhash.xxh3_64_intdigest(data)) + bytes(data)


def unseal(value: bytes, key: bytes | None = None, name: str = "") -> bytes | None:
    """The payload of a value, or None if it is damaged (or, with a key, forged)."""
    head = MAC_SIZE if key is not None else CHECK.size
    if value is None or len(value) < head:
        return None
    payload = memoryview(value)[head:]
    if key is not None:
        if not hmac.compare_digest(_mac(key, name, payload), bytes(value[:head])):
            return None
    elif CHECK.unpack_from(value)[0] != xxhash.xxh3_64_intdigest(payload):
        return None
    return bytes(payload)


class _Peer:
    def __init__(self, addr: tuple[str, int]):
        from pymemcache.client.base import PooledClient
        self.addr = addr
        self.client = PooledClient(addr, connect_timeout=TIMEOUT, timeout=TIMEOUT,
                                   no_delay=True, max_pool_size=64, default_noreply=False)
        self.dead_until = 0.0
        self.backoff = BACKOFF[0]


class PeerCache:
    """peers: node i's memcached at position i; me: this node (it publishes there)."""

    def __init__(self, peers: Sequence[tuple[str, int]], me: int, namespace: str,
                 stats: Stats, bandwidth_limit: int | None = None, key: bytes | None = None):
        self.key_bytes = key
        if key is None:
            log.warning("peers without --peer-key: values are checked for damage only, and "
                        "anyone who can write to a peer's memcached can forge segments "
                        "(docs/SECURITY.md)")
        self.peers = [_Peer(a) for a in peers]
        self.me = me
        self.ns = namespace
        self.stats = stats
        self.throttle = TokenBucket(bandwidth_limit) if bandwidth_limit else None
        self._lock = threading.Lock()

    def key(self, record: int, offset: int, length: int) -> str:
        return f"pcrfs:{self.ns}:{record}:{offset}:{length}"

    def _usable(self, p: _Peer) -> bool:
        return time.monotonic() >= p.dead_until

    def _failed(self, p: _Peer, e: Exception) -> None:
        with self._lock:
            if self._usable(p):
                log.warning("peer %s:%d: %s; asking storage for %.0f s", *p.addr, e, p.backoff)
            p.dead_until = time.monotonic() + p.backoff
            p.backoff = min(p.backoff * 2, BACKOFF[1])
        self.stats.add(peer_errors=1)

    def _alive(self, p: _Peer) -> None:
        if p.backoff != BACKOFF[0]:
            with self._lock:
                p.backoff = BACKOFF[0]

    def get(self, owner: int, record: int, segments: Sequence[tuple[int, int]]
            ) -> dict[tuple[int, int], bytes]:
        """The segments (offset, length) the owner's memcached holds, each verified."""
        p = self.peers[owner]
        if not self._usable(p):
            self.stats.add(peer_misses=len(segments))
            return {}
        keys = {self.key(record, o, m): (o, m) for off, n in segments for o, m in pieces(off, n)}
        try:
            got = p.client.get_many(list(keys))
        except Exception as e:  # noqa: BLE001 - socket errors, timeouts, protocol errors
            self._failed(p, e)
            self.stats.add(peer_misses=len(segments))
            return {}
        self._alive(p)
        found = {}
        corrupt = 0
        for key, piece in keys.items():
            value = got.get(key)
            if value is None:
                continue
            payload = unseal(value, self.key_bytes, key)
            if payload is None or len(payload) != piece[1]:
                corrupt += 1
                log.warning("peer %s:%d: value %s is damaged; reading storage", *p.addr, key)
                continue
            found[piece] = payload
        out = {}
        for off, n in segments:     # a segment counts only if every piece of it came
            parts = [found.get(piece) for piece in pieces(off, n)]
            if all(x is not None for x in parts):
                out[(off, n)] = b"".join(parts)
        nbytes = sum(len(v) for v in out.values())
        if self.throttle and nbytes:
            self.throttle.consume(nbytes)
        self.stats.add(peer_hits=len(out), peer_misses=len(segments) - len(out),
                       peer_bytes=nbytes, peer_corrupt=corrupt)
        return out

    def publish(self, record: int, items: Sequence[tuple[int, int, bytes]]) -> int:
        """Store (offset, length, bytes) of this node's record in its memcached; returns
        the values stored (those over memcached's item size are not).  A memcached that
        restarted leaves the pool's connections dead: they are dropped and the set tried
        once more; OSError if that fails too (a warm must not report it published)."""
        p = self.peers[self.me]
        values = {k: seal(data[o - off : o - off + m], self.key_bytes, k)
                  for off, n, data in items for o, m in pieces(off, n)
                  for k in (self.key(record, o, m),)}
        if not values:
            return 0
        for attempt in (0, 1):
            try:
                failed = p.client.set_many(values, noreply=False)
                break
            except Exception as e:  # noqa: BLE001
                p.client.close()        # every pooled connection: a new one next time
                if attempt:
                    self._failed(p, e)
                    raise OSError(f"memcached {p.addr[0]}:{p.addr[1]}: {e}") from None
        self._alive(p)
        stored = len(values) - len(failed or [])
        self.stats.add(peer_published=stored)
        return stored

    def status(self) -> list[dict]:
        now = time.monotonic()
        return [{"peer": f"{p.addr[0]}:{p.addr[1]}", "up": now >= p.dead_until}
                for p in self.peers]


def namespace(uuid_hex: str) -> str:
    """Keys of one dataset; PCRFS_PEER_NAMESPACE adds a prefix (several clusters, one
    memcached)."""
    return (os.environ.get("PCRFS_PEER_NAMESPACE", "") + uuid_hex.replace("-", ""))[:40]
