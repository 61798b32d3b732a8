"""Volume logs on the plugin's stdout, so that `kubectl logs` shows them: each volume's
supervisor and daemons write their log file under --state-dir (it outlives the plugin,
as the mounts do), and one thread copies every new line to stdout, tagged
`[volume VOLUME_ID]`.  A plugin started again picks its volumes' logs up at their ends."""
from __future__ import annotations

import os
import sys
import threading

POLL_S = 0.25
MAX_LINE = 64 << 10     # a longer line is cut there (one log record, not a file)


class LogRelay:
    def __init__(self, out=None):
        self.out = out or sys.stdout
        self._logs: dict[str, list] = {}        # path -> [tag, offset, partial line]
        self._lock = threading.Lock()
        self._io = threading.Lock()             # one copier at a time
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pcrfs-csi-logs", daemon=True)
        self._thread.start()

    def follow(self, path: str, volume_id: str, from_end: bool = False) -> None:
        """Copy path's lines from its start (a new volume), or from its end (a volume
        a previous plugin started)."""
        try:
            at = os.path.getsize(path) if from_end else 0
        except OSError:
            at = 0
        with self._lock:
            self._logs.setdefault(path, [f"[volume {volume_id}] ", at, b""])

    def forget(self, path: str) -> None:
        """After a last copy of what the volume wrote before it stopped."""
        with self._lock:
            entry = self._logs.pop(path, None)
        if entry is not None:
            self._copy(path, entry, flush_partial=True)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            with self._lock:
                items = list(self._logs.items())
            for path, entry in items:
                self._copy(path, entry)

    def _copy(self, path: str, entry: list, flush_partial: bool = False) -> None:
        with self._io:
            self._copy_new(path, entry, flush_partial)

    def _copy_new(self, path: str, entry: list, flush_partial: bool) -> None:
        tag, at, partial = entry
        try:
            with open(path, "rb") as f:
                if os.fstat(f.fileno()).st_size < at:   # replaced or truncated: from 0
                    at = 0
                f.seek(at)
                data = f.read(1 << 20)
        except OSError:
            return
        entry[1] = at + len(data)
        *lines, rest = (partial + data).split(b"\n")
        if flush_partial and rest:
            lines, rest = [*lines, rest], b""
        entry[2] = rest[-MAX_LINE:]
        if lines:
            text = "".join(f"{tag}{ln[:MAX_LINE].decode(errors='replace')}\n" for ln in lines)
            try:
                self.out.write(text)
                self.out.flush()
            except (OSError, ValueError):
                pass
