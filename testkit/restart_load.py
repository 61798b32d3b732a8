"""Readers for the restart tests and bench/restart.py: threads that open, read and close
random files of a mount (and list their directories now and then), compare every byte
with the dataset API's, and keep each read's start and duration, so a stall can be
pinned on the kill that caused it."""
from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pcrfs


class ReadLoad:
    def __init__(self, mnt: Path, ds_path, views: list[str], threads: int,
                 per_view: int = 20, seed: int = 41):
        rnd = random.Random(seed)
        ds = pcrfs.open_dataset(str(ds_path))
        self.expected: dict[Path, bytes] = {}
        try:
            for view in views:
                files = sorted(os.path.relpath(os.path.join(d, f), mnt / view)
                               for d, _, fs in os.walk(mnt / view) for f in fs)
                assert files, f"nothing in {view}"
                # dynamic/ serves qG until told otherwise
                name = f"q{ds.groups}" if view == "dynamic" else view
                for rel in rnd.sample(files, min(per_view, len(files))):
                    self.expected[mnt / view / rel] = ds.read(rel.encode(), name)
        finally:
            ds.close()
        self.paths = sorted(self.expected)
        self.threads = threads
        self.seed = seed
        self.errors: list[tuple[str, str]] = []
        self.mismatches: list[str] = []
        self.log: list[tuple[float, float]] = []     # (start, seconds) of every read
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []

    def _work(self, i: int) -> None:
        rnd = random.Random(self.seed * 1000 + i)
        log = []
        while not self._stop.is_set():
            p = rnd.choice(self.paths)
            t = time.monotonic()
            try:
                if rnd.random() < 0.1:
                    os.listdir(p.parent)
                with open(p, "rb") as f:
                    got = f.read()
            except OSError as e:
                self.errors.append((str(p), f"{type(e).__name__}: {e}"))
                continue
            log.append((t, time.monotonic() - t))
            if got != self.expected[p]:
                self.mismatches.append(str(p))
            if len(log) >= 256:
                self.log.extend(log)
                log = []
        self.log.extend(log)

    def start(self) -> ReadLoad:
        self._workers = [threading.Thread(target=self._work, args=(i,), daemon=True)
                         for i in range(self.threads)]
        for t in self._workers:
            t.start()
        return self

    def reads(self) -> int:
        return len(self.log)

    def stop(self, timeout: float = 60.0) -> dict:
        self._stop.set()
        for t in self._workers:
            t.join(timeout)
        hung = sum(t.is_alive() for t in self._workers)
        return {"reads": len(self.log), "errors": len(self.errors),
                "mismatches": len(self.mismatches), "hung_readers": hung,
                "longest_read_s": max((d for _, d in self.log), default=0.0)}

    def longest_after(self, since: float, until: float) -> float:
        """The longest read that was under way at some moment in [since, until]."""
        return max((d for t, d in list(self.log) if t <= until and t + d >= since), default=0.0)
