"""Which tests mount: a thread waits on /proc/self/mountinfo (the kernel flags it with
POLLPRI at every mount and unmount) and notes each new mount point this run made: under
its basetemp, or of type fuse* elsewhere when a process of this run serves it (its
environment carries this run's token, its command line names the mount point).  Other
FUSE mounts of the machine (a developer's, another job's) come and go unnoticed.
conftest.py fails a test that mounted without the `mounts` marker, so the markers are
what the tests do and `make test-fast`, which leaves marked tests out, mounts nothing."""
from __future__ import annotations

import os
import select
import threading
import uuid

PYTEST_TMP = "/tmp/pytest-of-"
TOKEN_VAR = "PCRFS_TEST_RUN"


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo
    return field.encode().decode("unicode_escape")


class MountWatch:
    def __init__(self, basetemp: str):
        self.basetemp = basetemp.rstrip("/") + "/"
        # every process this run starts inherits it (set before any is started)
        self.token = os.environ.setdefault(TOKEN_VAR, uuid.uuid4().hex)
        # (mount ID, mount point) -> served by this run; only mounts present now are kept,
        # since the kernel gives an unmounted mount's ID to a later one
        self._served: dict[tuple[str, str], bool] = {}
        self._lock = threading.Lock()
        self._new: list[str] = []
        self._f = open("/proc/self/mountinfo", "rb", buffering=0)  # noqa: SIM115 - the thread's
        self._known = self._ours()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="mountwatch", daemon=True)
        self._thread.start()

    def _ours(self) -> set[str]:
        self._f.seek(0)
        chunks = []
        while chunk := self._f.read(1 << 16):
            chunks.append(chunk)
        out = set()
        served = {}
        for line in b"".join(chunks).decode(errors="replace").splitlines():
            head, _, tail = line.partition(" - ")
            fields, fstype = head.split(), tail.split(" ", 1)[0]
            if len(fields) < 5:
                continue
            mp = _unescape(fields[4])
            if mp.startswith(self.basetemp):
                out.add(mp)
            elif fstype.startswith("fuse") and not mp.startswith(PYTEST_TMP):
                key = (fields[0], mp)
                served[key] = self._served[key] if key in self._served \
                    else self._served_by_this_run(mp)
                if served[key]:
                    out.add(mp)
        self._served = served
        return out

    def _served_by_this_run(self, mp: str) -> bool:
        want = (f"{TOKEN_VAR}={self.token}").encode()
        arg = mp.encode()
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if arg not in f.read().split(b"\0"):
                        continue
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if want in f.read().split(b"\0"):
                        return True
            except OSError:      # gone meanwhile, or not ours to read
                continue
        return False

    def _run(self) -> None:
        p = select.poll()
        p.register(self._f, select.POLLPRI | select.POLLERR)
        while not self._stop:
            if not p.poll(500):
                continue
            now = self._ours()
            with self._lock:
                self._new += sorted(now - self._known)
                self._known = now

    def take(self) -> list[str]:
        """The mount points that appeared since the last call."""
        with self._lock:
            new, self._new = self._new, []
        return new

    def close(self) -> None:
        self._stop = True
        self._thread.join(timeout=2)
        self._f.close()
