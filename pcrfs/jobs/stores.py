"""Where a build reads its sources and writes its dataset: a local directory or an
s3://, gs:// or az:// prefix, behind one small interface.

A store is a description (a path, or a URL and its remote options) and is pickled to
cluster workers as such; each process opens its own client on first use.  Keys are
'/'-separated and relative to the store's root.  Every write is whole or absent: a local
file is written beside its name and renamed (fsynced), an object is one PUT."""
from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Iterable

from pcrfs.errors import PcrfsError


class LocalStore:
    remote = False
    counts: Counter = Counter()    # requests to object storage: none

    def __init__(self, root: str):
        self.root = root

    def view(self) -> LocalStore:
        return self

    def path(self, key: str) -> str:
        return os.path.join(self.root, key)

    def describe(self, key: str = "") -> str:
        return self.path(key) if key else self.root

    def read(self, key: str) -> bytes:
        with open(self.path(key), "rb") as f:
            return f.read()

    def write(self, key: str, chunks: bytes | Iterable[bytes]) -> None:
        from pcrfs.format.atomic import atomic_write
        path = self.path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # a temporary of this process and thread: the parts of a --part build may write
        # the same (identical) state file at once
        with atomic_write(path, tmp=f"{path}.{os.getpid()}.{threading.get_ident()}.tmp") as f:
            for c in [chunks] if isinstance(chunks, bytes | bytearray | memoryview) else chunks:
                f.write(c)

    def size(self, key: str) -> int | None:
        try:
            return os.stat(self.path(key)).st_size
        except FileNotFoundError:
            return None

    def list(self, prefix: str = "") -> dict[str, int]:
        """key -> size of the files directly under the directory `prefix`."""
        base = self.path(prefix.rstrip("/")) if prefix else self.root
        try:
            entries = list(os.scandir(base))
        except FileNotFoundError:
            return {}
        lead = prefix.rstrip("/") + "/" if prefix else ""
        return {lead + e.name: e.stat().st_size for e in entries if e.is_file()}

    def delete(self, key: str) -> None:
        try:
            os.unlink(self.path(key))
        except FileNotFoundError:
            pass


_CLIENTS: dict = {}            # (url, options) -> ObjectClient: one per process
_CLIENTS_LOCK = threading.Lock()


class ObjectStore:
    """Counts its requests by method (`counts`); `view()` is a fresh counter on the same
    process-wide client, so a task can report what it alone asked for."""
    remote = True

    def __init__(self, url: str, opts=None):
        self.url, self.opts = url.rstrip("/"), opts
        self.counts: Counter = Counter()
        self._lock = threading.Lock()

    def __getstate__(self):
        return {"url": self.url, "opts": self.opts}

    def __setstate__(self, state):
        self.__init__(state["url"], state["opts"])

    def _count(self, method: str) -> None:
        with self._lock:
            self.counts[method] += 1

    def view(self) -> ObjectStore:
        return ObjectStore(self.url, self.opts)

    @property
    def client(self):
        # the credentials in the environment are part of what a client is
        key = (self.url, self.opts, tuple(sorted(
            (k, v) for k, v in os.environ.items() if k.startswith(("AWS_", "AZURE_", "GOOGLE_")))))
        with _CLIENTS_LOCK:
            c = _CLIENTS.get(key)
            if c is None:
                from pcrfs.storage.objclient import ObjectClient
                c = _CLIENTS[key] = ObjectClient(self.url, self.opts)
        return c

    def describe(self, key: str = "") -> str:
        return f"{self.url}/{key}" if key else self.url

    def read(self, key: str) -> bytes:
        self._count("GET")
        return self.client.get(key)

    def write(self, key: str, chunks: bytes | Iterable[bytes]) -> None:
        data = chunks if isinstance(chunks, bytes) else b"".join(chunks)
        self._count("PUT")
        self.client.put_bytes(key, data)

    def size(self, key: str) -> int | None:
        self._count("HEAD")
        return self.client.head(key)

    def list(self, prefix: str = "") -> dict[str, int]:
        """key -> size of every object under `prefix` (recursively: object stores have
        no directories)."""
        self._count("LIST")
        return dict(self.client.list(prefix))

    def delete(self, key: str) -> None:
        self._count("DELETE")
        self.client.delete(key)


def open_store(where: str, opts=None):
    from pcrfs.storage.objclient import WRITABLE, is_remote
    if is_remote(where):
        if not where.startswith(WRITABLE):
            raise PcrfsError(f"{where}: a build reads and writes local paths, s3://, gs:// or "
                             f"az:// (http(s):// is read-only)")
        return ObjectStore(where, opts)
    return LocalStore(where)

