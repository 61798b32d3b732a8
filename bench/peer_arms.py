#!/usr/bin/env python3
"""The loaders a user would pick instead of pcrfs, each with its own writer and reader, for
bench/peers.py.  Runs in the peers' environment (.venv-peers: WebDataset, LitData, MosaicML
Streaming, FFCV and DALI, layered on the main .venv), one process per call:

  peer_arms.py convert SYSTEM ARGS.json  -> {"seconds", "images", "stored_bytes"}
  peer_arms.py epoch SYSTEM ARGS.json    -> {"rate", "epoch_rate", "images", ...}
  peer_arms.py serve                     the same calls in turn, one JSON line each (tests)

ARGS: {"items": [[path, label], ...], "out": DIR (the system's converted copy), and for an
epoch "root" (an ImageFolder: imagefolder and pcrfs), "remote" ({"endpoint", "bucket",
"prefix", "key", "secret"}: read through the system's own S3 client), "cache" (its local
cache directory), "cache_bytes" (its bound), "batch", "workers", "check" (per-sample checks
of the tests)}.  Every reader yields float32 batches (B, 3, 224, 224) after
RandomResizedCrop(224), a random flip and ImageNet normalisation."""
from __future__ import annotations

import io
import json
import os
import sys
import time
from pathlib import Path

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
WARM = 2          # steady state: timed from the arrival of the WARM-th batch
COPY = [0.0]      # seconds a system spent copying its data down before its first batch


def _tf():
    from torchvision import transforms
    return transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                               transforms.ToTensor(), transforms.Normalize(MEAN, STD)])


def _decode(data: bytes):
    from PIL import Image
    return Image.open(io.BytesIO(data)).convert("RGB")


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


# -- writers ---------------------------------------------------------------------------------
def _litdata_item(item):
    path, label = item
    return {"image": Path(path).read_bytes(), "label": int(label)}


class _Pictures:
    """(H x W x 3 uint8, label) by index: what FFCV's writer takes."""

    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        import numpy as np
        from PIL import Image
        path, label = self.items[i]
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB")), int(label)


def _shard(a: dict) -> int:
    return int(a.get("shard_bytes") or 64 << 20)


def convert(system: str, a: dict) -> dict:
    items, out = a["items"], Path(a["out"])
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if system == "webdataset":
        import webdataset as wds
        with wds.ShardWriter(str(out / "shard-%06d.tar"), maxsize=_shard(a), maxcount=10**9,
                             verbose=0) as sink:
            for i, (path, label) in enumerate(items):
                sink.write({"__key__": f"{i:09d}", "jpg": Path(path).read_bytes(), "cls": int(label)})
    elif system == "litdata":
        import litdata
        litdata.optimize(fn=_litdata_item, inputs=items, output_dir=str(out), chunk_bytes=_shard(a),
                         num_workers=a.get("workers", 2), verbose=False, mode="overwrite")
    elif system == "mosaicml-streaming":
        from streaming import MDSWriter
        with MDSWriter(out=str(out), columns={"jpg": "bytes", "cls": "int"},
                       size_limit=_shard(a)) as w:
            for path, label in items:
                w.write({"jpg": Path(path).read_bytes(), "cls": int(label)})
    elif system == "ffcv":
        from ffcv.fields import IntField, RGBImageField
        from ffcv.writer import DatasetWriter
        # FFCV's ImageNet recipe stores JPEG re-encoded at quality 90 (write_mode="jpg"); the
        # original bytes cannot be kept by its image field
        DatasetWriter(str(out / "data.beton"),
                      {"image": RGBImageField(write_mode="jpg", jpeg_quality=90),
                       "label": IntField()},
                      num_workers=a.get("workers", 2)).from_indexed_dataset(_Pictures(items))
    elif system == "dali":
        pass      # DALI reads the original files: it has no format of its own
    else:
        raise SystemExit(f"no writer for {system}")
    seconds = time.perf_counter() - t0
    stored = _du(out) if system != "dali" else sum(Path(p).stat().st_size for p, _ in items)
    return {"seconds": seconds, "images": len(items), "stored_bytes": stored}


# -- readers ---------------------------------------------------------------------------------
def _s3_client(r: dict):
    import boto3
    return boto3.client("s3", endpoint_url=r["endpoint"], aws_access_key_id=r["key"],
                        aws_secret_access_key=r["secret"], region_name="us-east-1")


def _torch_loader(ds, a, **kw):
    import torch
    # fork, Linux's default, named: litdata's optimize sets spawn for the whole process,
    # which a long-lived `serve` process would otherwise keep
    return torch.utils.data.DataLoader(ds, batch_size=a.get("batch", 64),
                                       num_workers=a.get("workers", 2),
                                       multiprocessing_context="fork", **kw)


def _mosaic_own_client(_worker: int) -> None:
    """A DataLoader worker's own S3 client for MosaicML Streaming.  StreamingDataset opens
    its S3 connection in the parent (it fetches index.json there), and forked workers
    inherit that socket: two of them downloading shards at once read each other's
    responses, and a shard lands cut short or with another shard's bytes
    (PIL.UnidentifiedImageError, or "Relative sample index ... not present").  Seen
    whenever a bandwidth limit makes downloads overlap: 2 of 4 epochs at 50 MB/s, a shard
    1,675,433 bytes long where the bucket's has 1,679,772; with this, 0 of 4.  Mosaic's
    pickling drops the client for spawn; fork needs the same (its downloader's clean_up)."""
    import torch
    for stream in torch.utils.data.get_worker_info().dataset.streams:
        stream._downloader.clean_up()


def reader(system: str, a: dict):
    """An iterable of (images, labels) batches for one epoch."""
    out, r = Path(a.get("out", "")), a.get("remote")
    tf = _tf()
    if system in ("imagefolder", "pcrfs"):
        from torchvision import datasets
        return _torch_loader(datasets.ImageFolder(a["root"], transform=tf), a, shuffle=True)
    if system == "pcrfs-fused":
        return _fused(a)
    if system == "webdataset":
        import webdataset as wds
        names = sorted(p.name for p in out.glob("shard-*.tar"))
        if r:
            # curl signs each GET itself (SigV4): a URL that stays the same across epochs,
            # which webdataset's cache names its files after
            urls = [f"pipe:curl -sf --aws-sigv4 aws:amz:us-east-1:s3 -u {r['key']}:{r['secret']} "
                    f"{r['endpoint']}/{r['bucket']}/{r['prefix']}/{n}" for n in names]
        else:
            urls = [str(out / n) for n in names]
        kw = {}
        if r and a.get("cache_bytes"):
            kw = {"cache_dir": a["cache"], "cache_size": a["cache_bytes"]}
        ds = (wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False, **kw)
              .shuffle(1000).to_tuple("jpg", "cls")
              .map_tuple(lambda b: tf(_decode(b)), int))
        return _torch_loader(ds, a)
    if system == "litdata":
        import litdata
        from litdata.streaming.resolver import Dir

        class Images(litdata.StreamingDataset):
            def __getitem__(self, index):
                d = super().__getitem__(index)
                return tf(_decode(d["image"])), d["label"]
        if r:
            # litdata builds its obstore S3Store with fixed client options that lack
            # allow_http, so a plain-http endpoint (this SeaweedFS; real S3 is https) fails
            # in reqwest with BadScheme; AWS_ALLOW_HTTP does not reach them
            import litdata.streaming.downloader as dl
            if hasattr(dl, "_OBSTORE_CLIENT_OPTIONS"):
                dl._OBSTORE_CLIENT_OPTIONS = {**dl._OBSTORE_CLIENT_OPTIONS, "allow_http": "true"}
            ds = Images(Dir(path=a["cache"], url=f"s3://{r['bucket']}/{r['prefix']}"), shuffle=True,
                        max_cache_size=a.get("cache_bytes") or "100GB",
                        storage_options={"endpoint_url": r["endpoint"],
                                         "aws_access_key_id": r["key"],
                                         "aws_secret_access_key": r["secret"]})
        else:
            ds = Images(str(out), shuffle=True)
        return litdata.StreamingDataLoader(ds, batch_size=a.get("batch", 64),
                                           num_workers=a.get("workers", 2),
                                           multiprocessing_context="fork")
    if system == "mosaicml-streaming":
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory
        clean_stale_shared_memory()

        class Images(StreamingDataset):
            def __getitem__(self, index):
                d = super().__getitem__(index)
                return tf(_decode(d["jpg"])), d["cls"]
        kw = {"local": str(out)}
        if r:
            os.environ["S3_ENDPOINT_URL"] = r["endpoint"]
            os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"] = r["key"], r["secret"]
            kw = {"remote": f"s3://{r['bucket']}/{r['prefix']}", "local": a["cache"],
                  "cache_limit": a.get("cache_bytes")}
        ds = Images(shuffle=True, batch_size=a.get("batch", 64), **kw)
        return _torch_loader(ds, a, worker_init_fn=_mosaic_own_client if r else None)
    if system == "ffcv":
        return _ffcv(a, out, r)
    if system == "dali":
        return _dali(a)
    raise SystemExit(f"no reader for {system}")


def _fused(a):
    """pcrfs's FastImageFolder: the fused C decode-crop-resize in threads of this process
    (one per core), normalised to float32 in the same C pass, as the other readers'
    output is.  With a["objects"] (the source JPEGs, object by object, as DALI reads them):
    its samples from the local tree a["root"], their bytes from S3 (_ObjectLoader).  Not
    a["remote"]: every S3 epoch has that, the mounted arms' included."""
    from pcrfs.torch.fast_folder import FastImageFolder
    ds = FastImageFolder(a["root"], size=224, normalize=(MEAN, STD))
    if a.get("objects"):
        return _ObjectLoader(ds, a["objects"], a.get("batch", 64))
    return ds.loader(a.get("batch", 64), threads=os.cpu_count())


GETS_IN_FLIGHT = 32


def _object_loader_class():
    from pcrfs.torch.fast_folder import FastLoader

    class ObjectLoader(FastLoader):
        """FastLoader whose files are S3 objects: a batch's GETs are all issued when it is
        submitted (GETS_IN_FLIGHT threads; prefetch keeps the next batch's going while
        this one decodes), and each decoding thread takes its samples' bytes as they
        arrive.  What a user of FastImageFolder with source JPEGs in a bucket would write."""

        def __init__(self, ds, remote: dict, batch: int):
            from concurrent.futures import ThreadPoolExecutor

            import obstore
            from obstore.store import S3Store
            super().__init__(ds, batch, threads=os.cpu_count())
            store = S3Store(remote["bucket"], endpoint=remote["endpoint"], region="us-east-1",
                            access_key_id=remote["key"], secret_access_key=remote["secret"],
                            virtual_hosted_style_request=False,
                            client_options={"allow_http": True})
            root = Path(ds.root)
            keys = [f"{remote['prefix']}/{Path(p).relative_to(root).as_posix()}"
                    for p, _ in ds.samples]
            self._get = lambda i: bytes(obstore.get(store, keys[i]).bytes())
            self._io = ThreadPoolExecutor(GETS_IN_FLIGHT, thread_name_prefix="s3-get")
            self._bytes: dict = {}

        def _submit(self, members, pos):
            for i in members:
                self._bytes[i] = self._io.submit(self._get, i)
            return super()._submit(members, pos)

        def _result(self, job):
            out = super()._result(job)
            for i in job[0]:
                self._bytes.pop(i, None)
            return out

        def _chunk(self, members, x, lo, hi):
            from pcrfs.torch.loading import SampleError
            errs = []
            for j in range(lo, hi):
                i = members[j]
                try:
                    self.ds.decode(i, self._bytes[i].result(), out=x[j])
                    errs.append(None)
                except SampleError as e:
                    errs.append(e)
                except Exception as e:  # noqa: BLE001 - a failed GET is that sample's error
                    errs.append(SampleError(i, self.ds.samples[i][0], str(e)))
            return errs
    return ObjectLoader


def _ObjectLoader(ds, remote: dict, batch: int):  # noqa: N802 - a class, made on first use
    return _object_loader_class()(ds, remote, batch)


def _ffcv(a, out: Path, r):
    import numpy as np
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import NormalizeImage, RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage
    path = out / "data.beton"
    if r:
        # FFCV reads one memory-mapped local file: a remote dataset is copied down first,
        # whole (the copy is part of the epoch's time)
        path = Path(a["cache"]) / "data.beton"
        path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        _s3_client(r).download_file(r["bucket"], f"{r['prefix']}/data.beton", str(path))
        COPY[0] = time.perf_counter() - t0
    mean, std = np.array(MEAN) * 255, np.array(STD) * 255
    return Loader(str(path), batch_size=a.get("batch", 64), num_workers=a.get("workers", 2),
                  order=OrderOption.RANDOM, drop_last=False,
                  pipelines={"image": [RandomResizedCropRGBImageDecoder((224, 224)),
                                       RandomHorizontalFlip(), NormalizeImage(mean, std, np.float32),
                                       ToTensor(), ToTorchImage()],
                             "label": [IntDecoder(), ToTensor(), Squeeze()]})


def _dali(a):
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
    r = a.get("remote")
    files = [p for p, _ in a["items"]]
    if r:
        os.environ["AWS_ENDPOINT_URL"] = r["endpoint"]
        os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"] = r["key"], r["secret"]
        files = [f"s3://{r['bucket']}/{r['prefix']}/{k}" for k in a["keys"]]
    labels = [int(lab) for _, lab in a["items"]]

    @pipeline_def(batch_size=a.get("batch", 64), num_threads=a.get("workers", 2), device_id=None)
    def pipe():
        jpegs, lab = fn.readers.file(files=files, labels=labels, random_shuffle=True,
                                     name="reader")
        im = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
        im = fn.resize(im, resize_x=224, resize_y=224)
        im = fn.crop_mirror_normalize(im, dtype=types.FLOAT, output_layout="CHW",
                                      mean=[m * 255 for m in MEAN], std=[s * 255 for s in STD],
                                      mirror=fn.random.coin_flip())
        return im, lab
    p = pipe()
    p.build()
    it = DALIGenericIterator([p], ["x", "y"], reader_name="reader",
                             last_batch_policy=LastBatchPolicy.PARTIAL)
    return ((b[0]["x"], b[0]["y"].reshape(-1)) for b in it)


# what a training process has imported before its first epoch: an epoch's clock starts
# after them (measured on this VM: torchvision's datasets and transforms alone take ~2 s,
# MosaicML's streaming 3.9 s, against S3 epochs of 1-3 s)
IMPORTS = {"imagefolder": ["torchvision.datasets"], "pcrfs": ["torchvision.datasets"],
           "pcrfs-fused": ["pcrfs.torch.fast_folder", "torchvision.datasets"],
           "webdataset": ["webdataset"], "litdata": ["litdata", "litdata.streaming.resolver"],
           "mosaicml-streaming": ["streaming"], "dali": ["nvidia.dali.plugin.pytorch"],
           "ffcv": ["ffcv.loader", "ffcv.transforms", "ffcv.fields.decoders"]}


def epoch(system: str, a: dict) -> dict:
    """One epoch: the steady-state rate (from the WARM-th batch on), the whole rate, when
    each batch came (seconds from the epoch's start), and with a["check"] what the tests
    assert (shapes, dtypes, labels, each image's colour)."""
    import importlib

    import torch
    for m in ["torchvision.transforms", *IMPORTS.get(system, [])]:
        importlib.import_module(m)
    check = a.get("check")
    arrivals = []
    t = time.perf_counter()
    batches = reader(system, a)
    n = n0 = 0
    t0 = t
    shapes, labels, colour_miss = set(), {}, 0
    for i, (x, y) in enumerate(batches):
        y = y.reshape(-1)          # FFCV's Squeeze leaves a batch of one 0-d
        n += len(y)
        arrivals.append(round(time.perf_counter() - t, 4))
        if check:
            shapes.add((tuple(x.shape[1:]), str(x.dtype)))
            for lab in y.tolist():
                labels[int(lab)] = labels.get(int(lab), 0) + 1
            # the test images of class c are saturated in channel c: a label that travelled
            # with another image shows up here
            means = x.float().mean(dim=(2, 3)) * torch.tensor(STD) + torch.tensor(MEAN)
            colour_miss += int((means.argmax(dim=1) != y.long()).sum())
        if i + 1 == WARM:
            n0, t0 = n, time.perf_counter()
    end = time.perf_counter()
    # an epoch of WARM batches or fewer (a small --source) has no steady state: its rates
    # are the whole epoch's
    if n <= n0:
        n0, t0 = 0, t
    res = {"rate": (n - n0) / (end - t0) if n else 0.0, "warm_batches_skipped": n0 > 0,
           "epoch_rate": n / (end - t), "images": n, "seconds": end - t,
           # remote regimes: the whole epoch from its first request, with any whole-copy-first
           # time charged to it (a steady state from the WARM-th batch would hide what a
           # shuffle buffer or a shard download reads before that batch)
           "remote_rate": n / (end - t + COPY[0]) if n else 0.0,
           "remote_steady_rate": (n - n0) / (end - t0 + COPY[0]) if n else 0.0,
           "copy_s": COPY[0], "batch_s": arrivals}
    if check:
        res.update(shapes=sorted(map(list, shapes)), labels=labels, colour_miss=colour_miss)
    return res


def serve() -> int:
    """Calls in turn, one JSON line each on stdin ({"op", "system", "args"}), each answered
    with one line on the original stdout ({"ok": result} or {"error": ...}); what the
    libraries print goes to stderr."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    for line in sys.stdin:
        job = json.loads(line)
        try:
            res = {"ok": {"convert": convert, "epoch": epoch}[job["op"]](job["system"], job["args"])}
        except BaseException as e:      # SystemExit too: the caller gets the error, not EOF
            res = {"error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(res) + "\n")
        out.flush()
    return 0


def main() -> int:
    if sys.argv[1] == "serve":
        return serve()
    op, system, args = sys.argv[1], sys.argv[2], json.loads(Path(sys.argv[3]).read_text())
    res = {"convert": convert, "epoch": epoch}[op](system, args)
    print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
