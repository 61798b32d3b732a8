#!/usr/bin/env python3
"""The Python FUSE layer's limit: a minimal pyfuse3 filesystem serving a directory tree of
files from a dict in memory (loaded at start), with the same kernel options pcrfs uses.
Usage: minimal_fs.py SRC_DIR MNT   (foreground; SIGTERM unmounts)"""
import errno
import os
import signal
import stat
import sys

import pyfuse3
import trio


class MemFS(pyfuse3.Operations):
    def __init__(self, src: bytes):
        super().__init__()
        self.paths = {pyfuse3.ROOT_INODE: b""}
        self.inos = {b"": pyfuse3.ROOT_INODE}
        self.children: dict[int, dict[bytes, int]] = {pyfuse3.ROOT_INODE: {}}
        self.data: dict[int, bytes] = {}
        for dirpath, dirs, files in os.walk(src):
            rel = os.path.relpath(dirpath, src)
            parent = self._ino(b"" if rel == b"." else rel)
            for d in dirs:
                ino = self._ino(os.path.normpath(os.path.join(rel, d)))
                self.children[parent][d] = ino
                self.children.setdefault(ino, {})
            for f in files:
                ino = self._ino(os.path.normpath(os.path.join(rel, f)))
                self.children[parent][f] = ino
                with open(os.path.join(dirpath, f), "rb") as fh:
                    self.data[ino] = fh.read()
        self.files = {}

    def _ino(self, rel: bytes) -> int:
        if rel in (b"", b"."):
            return pyfuse3.ROOT_INODE
        if rel not in self.inos:
            self.inos[rel] = len(self.paths) + 1
            self.paths[self.inos[rel]] = rel
        return self.inos[rel]

    def _attr(self, ino):
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.entry_timeout = a.attr_timeout = 86400
        if ino in self.data:
            a.st_mode, a.st_size, a.st_nlink = stat.S_IFREG | 0o444, len(self.data[ino]), 1
        else:
            a.st_mode, a.st_size, a.st_nlink = stat.S_IFDIR | 0o555, 0, 2
        return a

    async def lookup(self, parent, name, ctx=None):
        ino = self.children.get(parent, {}).get(name)
        if ino is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attr(ino)

    async def getattr(self, ino, ctx=None):
        return self._attr(ino)

    async def opendir(self, ino, ctx):
        return ino

    async def readdir(self, ino, start, token):
        items = sorted(self.children[ino].items())
        for i in range(start, len(items)):
            if not pyfuse3.readdir_reply(token, items[i][0], self._attr(items[i][1]), i + 1):
                return

    async def open(self, ino, flags, ctx):
        return pyfuse3.FileInfo(fh=ino, keep_cache=True)

    async def read(self, fh, off, size):
        return self.data[fh][off:off + size]

    async def release(self, fh):
        pass

    async def flush(self, fh):
        pass


def main():
    src, mnt = os.fsencode(sys.argv[1]), sys.argv[2]
    fs = MemFS(src)
    pyfuse3.init(fs, mnt, {"fsname=memfs", "ro", "default_permissions"})
    print("ready", flush=True)

    async def run():
        async with trio.open_nursery() as n:
            async def sig():
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as s:
                    async for _ in s:
                        pyfuse3.terminate()
                        return
            n.start_soon(sig)
            await pyfuse3.main()
            n.cancel_scope.cancel()
    try:
        trio.run(run)
    finally:
        pyfuse3.close(unmount=True)


if __name__ == "__main__":
    main()
