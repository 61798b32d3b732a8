"""Calls into the trio loop from other threads.

The counters behind stats.json live in dicts that only the trio thread changes; another
thread (the Prometheus endpoint, the textfile writer) that walked them could meet one
mid-resize.  `OnLoop.call` runs a function on the trio thread instead, and runs it
directly where no loop runs (before the mount serves, after it stopped), when nothing
changes the dicts."""
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import trio

T = TypeVar("T")


class OnLoop:
    def __init__(self):
        self._token = None

    def bind(self) -> None:
        """Call on the trio thread once the loop runs."""
        self._token = trio.lowlevel.current_trio_token()

    def call(self, fn: Callable[[], T]) -> T:
        """fn() on the trio thread (from any other thread), waiting for its result."""
        if self._token is not None:
            try:
                return trio.from_thread.run_sync(fn, trio_token=self._token)
            except trio.RunFinishedError:
                self._token = None      # the loop ended: nothing changes the dicts now
        return fn()
