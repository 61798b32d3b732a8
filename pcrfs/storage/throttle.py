"""Token bucket on backend bytes (`--bandwidth-limit`), emulating a slow disk or network
the way the PCR paper did.  Called from worker threads only: it sleeps.  A remote store's
bytes are charged once they arrive (storage/remote.py), so a dead store's reads do not
queue here before their --io-timeout starts."""
from __future__ import annotations

import re
import threading
import time

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """'1G', '512M', '100k', '1.5GiB', '2000' -> bytes (binary multiples)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if not m:
        raise ValueError(f"not a size: {text!r} (examples: 512M, 1G, 100k)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def parse_rate(text: str) -> int:
    """'50M', '50MB/s', '400Mbit' -> bytes per second."""
    t = text.strip().lower().removesuffix("/s")
    if t.endswith("bit"):
        return parse_size(t[:-3]) // 8
    return parse_size(t)


class TokenBucket:
    def __init__(self, rate: float, burst: float | None = None):
        if rate <= 0:
            raise ValueError("bandwidth limit must be positive")
        self.rate = float(rate)
        self.burst = float(burst if burst is not None else rate / 20)  # 50 ms of credit
        self._lock = threading.Lock()
        self._t = time.monotonic()  # time at which the bucket is empty again

    def consume(self, n: int) -> None:
        """Block until n bytes may pass."""
        with self._lock:
            now = time.monotonic()
            start = max(self._t, now - self.burst / self.rate)
            self._t = start + n / self.rate
            wait = self._t - now - self.burst / self.rate
        if wait > 0:
            time.sleep(wait)
