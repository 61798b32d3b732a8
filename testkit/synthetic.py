"""Index-scale synthetic datasets: many paths sharing one tiny real JPEG, written through
the normal record/index/manifest code.  For scale tests and benchmarks (100k-entry
directories, a million files) where transcoding real images would only cost time."""
from __future__ import annotations

import io
import os
import time

import numpy as np
from PIL import Image

from pcrfs import native
from pcrfs.builder.plan import BuildOptions, BuildResult
from pcrfs.builder.prepare import Prepared
from pcrfs.builder.publish import finish
from pcrfs.builder.resume import open_partial
from pcrfs.builder.task import write_outputs
from pcrfs.errors import PcrfsError
from pcrfs.jobs.stores import LocalStore


def tiny_jpeg(seed: int = 0) -> Prepared:
    rnd = np.random.default_rng(seed)
    img = Image.fromarray(rnd.integers(0, 255, (8, 8, 3), dtype=np.uint8))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=75)
    t = native.transcode(buf.getvalue())
    ends = native.split_scans(t.data)
    return Prepared(b"", 0, True, data=t.data[: ends[-1]], ends=tuple(ends), width=8, height=8,
                    components=3, source_bytes=len(buf.getvalue()))


def build_synthetic(dst: str, classes: int, per_class: int, images_per_record: int = 1024,
                    name_fmt: str = "img_{:08d}.jpg") -> BuildResult:
    t0 = time.monotonic()
    if os.path.exists(dst):
        raise PcrfsError(f"{dst} already exists")
    tpl = tiny_jpeg()
    class_names = [f"c{c:05d}".encode() for c in range(classes)]
    opts = BuildOptions(images_per_record=images_per_record, progress=False)
    params = {"synthetic": True, "images_per_record": images_per_record,
              "shuffle_seed": None, "scans": "default", "keep_metadata": "default",
              "quality": 95}
    partial = dst.rstrip("/") + ".partial"
    total = classes * per_class
    state = {"plan_hash": "synthetic", "params": params, "planned": total,
             "records": -(-total // images_per_record), "parts": None, "stray": [],
             "classes": [os.fsdecode(c) for c in class_names], "source": "synthetic"}
    uid = open_partial(partial, opts, state)
    work = LocalStore(partial)
    batch, r = [], 0
    for c, cname in enumerate(class_names):
        for i in range(per_class):
            p = Prepared(cname + b"/" + name_fmt.format(c * per_class + i).encode(), c, True,
                         data=tpl.data, ends=tpl.ends, width=8, height=8, components=3,
                         source_bytes=tpl.source_bytes)
            batch.append(p)
            if len(batch) == images_per_record:
                write_outputs(work, r, uid, class_names, batch, False)
                batch, r = [], r + 1
    if batch:
        write_outputs(work, r, uid, class_names, batch, False)
    return finish(work, dst, uid, state, opts, t0)
