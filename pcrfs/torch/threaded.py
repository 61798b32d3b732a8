"""ThreadedDataset: the IBM paper's thread pool inside each DataLoader worker.

A DataLoader worker loads the samples of its batch one after another; most of that time
is spent where the GIL is released (file reads through the mount, Pillow's decode and
resize).  Wrapping the dataset gives it `__getitems__`, which DataLoader calls with the
whole batch: the samples are loaded by a thread pool, in order.  The pool belongs to the
process that uses it and is made on first use, so it is created after the worker forks
(threads do not survive fork)."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import torch.utils.data


class ThreadedDataset(torch.utils.data.Dataset):
    """`dataset` (an unmodified ImageFolder, or any map-style dataset) with `threads`
    loader threads per process.  Attributes of the wrapped dataset (classes, samples,
    targets) are passed through."""

    def __init__(self, dataset, threads: int = 4):
        if threads < 1:
            raise ValueError("threads must be at least 1")
        self.dataset = dataset
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._pid = None

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        return self.dataset[index]

    def _executor(self) -> ThreadPoolExecutor:
        if self._pid != os.getpid():        # a forked worker: its own pool
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="pcrfs-load")
            self._pid = os.getpid()
        return self._pool

    def __getitems__(self, indices):
        if self.threads == 1 or len(indices) <= 1:
            return [self.dataset[i] for i in indices]
        return list(self._executor().map(self.dataset.__getitem__, indices))

    def __getattr__(self, name):
        if name in ("dataset", "_pool", "_pid", "threads"):
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getstate__(self):
        return {"dataset": self.dataset, "threads": self.threads, "_pool": None, "_pid": None}
