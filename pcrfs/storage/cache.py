"""A byte-bounded, thread-safe LRU of fetched record extents."""
from __future__ import annotations

import threading
from collections import OrderedDict


class ByteLRU:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self.used = 0
        self._d: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key):
        with self._lock:
            v = self._d.get(key)
            if v is not None:
                self._d.move_to_end(key)
            return v

    def put(self, key, value) -> bool:
        size = len(value)
        if size > self.capacity:
            return False
        with self._lock:
            old = self._d.pop(key, None)
            if old is not None:
                self.used -= len(old)
            while self._d and self.used + size > self.capacity:
                _, v = self._d.popitem(last=False)
                self.used -= len(v)
            self._d[key] = value
            self.used += size
            return True

    def __len__(self) -> int:
        return len(self._d)
