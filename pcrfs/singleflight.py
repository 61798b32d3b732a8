"""One call per key at a time: concurrent callers of do(key, fn) share the leader's result
(or exception) instead of repeating the work (a transcode, an extent fetch)."""
from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")


class SingleFlight:
    def __init__(self):
        self._lock = threading.Lock()
        self._calls: dict[object, Future] = {}

    def do(self, key, fn: Callable[[], T]) -> T:
        with self._lock:
            fut = self._calls.get(key)
            leader = fut is None
            if leader:
                fut = self._calls[key] = Future()
        if not leader:
            return fut.result()
        try:
            out = fn()
            fut.set_result(out)
            return out
        except BaseException as e:
            fut.set_exception(e)
            raise
        finally:
            with self._lock:
                del self._calls[key]


class AsyncSingleFlight:
    """SingleFlight for trio tasks on the filesystem's loop: concurrent READs of one file
    wait for the first one's assembly instead of starting their own."""

    def __init__(self):
        self._calls: dict[object, tuple] = {}   # key -> (done event, [result or error])

    async def do(self, key, fn):
        import trio
        while (call := self._calls.get(key)) is not None:
            done, box = call
            await done.wait()
            if not isinstance(box[0], BaseException):
                return box[0]
            if isinstance(box[0], Exception):
                raise box[0]            # the call failed: it fails for every waiter
            # the leader was cancelled (its own cancel scope, not ours): try again, one
            # of us leading
        done, box = trio.Event(), [None]
        self._calls[key] = (done, box)
        try:
            box[0] = await fn()
            return box[0]
        except BaseException as e:
            box[0] = e
            raise
        finally:
            del self._calls[key]
            done.set()
