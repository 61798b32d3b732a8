"""MNT/dynamic/: the q view of the current dynamic fidelity, switched by writing
.pcrfs/control/dynamic_fidelity (views/control.py), no remount.

An open file keeps the fidelity it was opened with (the read is bound at open, and direct
I/O keeps the page cache from mixing two); after a switch the filesystem drops the
kernel's cached attributes of every dynamic inode, and listings are remade."""
from __future__ import annotations

from pcrfs.views.base import Opened, View

NAME = "dynamic"


class DynamicView(View):
    name = NAME
    immutable = False
    aliases = True

    def __init__(self, qviews: list, fidelity: int):
        self.qviews = {v.k: v for v in qviews}
        self.fidelity = fidelity
        self.switches = 0

    @property
    def current(self):
        return self.qviews[self.fidelity]

    def set_fidelity(self, k: int) -> bool:
        if k == self.fidelity:
            return False
        self.fidelity = k
        self.switches += 1
        return True

    def stats(self) -> dict:
        return {"dynamic_fidelity": f"q{self.fidelity}", "fidelity_switches": self.switches}

    def generation(self) -> int:
        return self.fidelity

    def lookup(self, path):
        return self.current.lookup(path)

    def serves_as(self, path):
        return self.current

    def list(self, path, sizes=False):
        return self.current.list(path, sizes)

    def open(self, path):
        q = self.current
        return Opened(None, lambda: q.read(path), True)

    def read(self, path):
        return self.current.read(path)

    def xattrs(self, path):
        return self.current.xattrs(path)

    def where(self, path):
        return self.current.where(path)
