"""Digests of every file of every view of a mounted dataset: the record of what a build
made, so a later build of the same sources can be held to the same bytes.

tests/data/golden_views.json holds them for tests/data/golden_src built with its
build_args by the pcrfs it names: python tests/golden.py MNT prints the "files" part."""
from __future__ import annotations

import json
import os
import re
import sys

import xxhash

VIEW = re.compile(r"^(q\d+|l3)$")


def view_digests(mnt: str) -> dict[str, list]:
    """"view/relative/path" -> [st_size, xxh3-64 hex of the bytes read]."""
    out = {}
    for view in sorted(v for v in os.listdir(mnt) if VIEW.match(v)):
        top = os.path.join(mnt, view)
        for d, _, files in os.walk(top):
            for f in files:
                p = os.path.join(d, f)
                with open(p, "rb") as fh:
                    data = fh.read()
                out[os.path.relpath(p, mnt)] = [os.stat(p).st_size, xxhash.xxh3_64_hexdigest(data)]
    return dict(sorted(out.items()))


if __name__ == "__main__":
    for k, v in view_digests(sys.argv[1]).items():
        print(f"{json.dumps(k)}: {json.dumps(v)},")
