"""The kernel's page cache, dropped between a benchmark's or a test's passes, so that a
cold pass reads through the mount (or the disk) again."""
from __future__ import annotations

import os

CLEAN_PAGES = 1          # page cache only
EVERYTHING = 3           # page cache, dentries and inodes


def drop_page_cache(what: int = EVERYTHING, sync: bool = True) -> bool:
    """Drop the kernel's caches (root only); False where this process may not."""
    if sync:
        os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write(f"{what}\n")
        return True
    except OSError:
        return False
