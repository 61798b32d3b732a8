"""The work no builder can skip: read each JPEG, transcode it losslessly to progressive
and split its scans, in-process with `workers` processes, nothing written.  Its rate over
the jpegtran loop's is the most any `pcrfs build` could reach on the same machine.

usage: transcode_only.py SRC WORKERS"""
import os
import sys
from multiprocessing import Pool

from pcrfs import native


def one(path: str) -> int:
    with open(path, "rb") as f:
        t = native.transcode(f.read())
    return len(native.split_scans(t.data))


def main() -> None:
    src, workers = sys.argv[1], int(sys.argv[2])
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(src) for f in fs)
    with Pool(workers) as pool:
        scans = sum(pool.imap_unordered(one, files, chunksize=16))
    print(len(files), scans)


if __name__ == "__main__":
    main()
