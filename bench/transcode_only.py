"""The work no builder can skip, in-process, nothing written: read each JPEG, transcode it
losslessly to progressive and split its scans; with --l3, also decode its pixels and size
and checksum their L3 encoding, as the default build must.  `workers` processes.  A build's
rate over this one's says how much the rest of the build (records, index, Python) costs.

usage: transcode_only.py SRC WORKERS [--l3]"""
import os
import sys
from multiprocessing import Pool

from pcrfs import l3, native
from pcrfs.format.checksum import block_checksum

WITH_L3 = "--l3" in sys.argv


def one(path: str) -> int:
    with open(path, "rb") as f:
        raw = f.read()
    t = native.transcode(raw)
    n = len(native.split_scans(t.data))
    if WITH_L3:
        out = l3.from_jpeg(raw)
        n += len(out) + block_checksum(out) % 2
    return n


def main() -> None:
    src, workers = sys.argv[1], int(sys.argv[2])
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(src) for f in fs)
    with Pool(workers) as pool:
        total = sum(pool.imap_unordered(one, files, chunksize=16))
    print(len(files), total)


if __name__ == "__main__":
    main()
