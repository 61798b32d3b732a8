"""Progressive Compressed Records as a read-only filesystem.

Datasets: build, push, info, verify, export, reindex, materialize.  Mounts: mount, umount,
status, set-fidelity, tune, warm, upgrade.  Planning: model.  Kubernetes: csi.
DST may be a directory or, for build/push/info/verify/export/mount, an s3://bucket/prefix,
gs://bucket/prefix, az://container/prefix or http(s)://host/path URL.
`pcrfs DST MNT -o OPTS` (what mount.fuse3 runs for fuse.pcrfs) is a mount."""
from __future__ import annotations

import argparse
import errno
import json
import os
import sys

from pcrfs.errors import PcrfsError
from pcrfs.storage import DEFAULT_IO_TIMEOUT


def _remote_opts(a):
    from pcrfs.storage.objclient import RemoteOptions
    return RemoteOptions(endpoint=a.endpoint, region=a.region, addressing=a.addressing,
                         io_timeout=a.io_timeout, no_sign_request=a.no_sign_request)


def _is_remote(path: str) -> bool:
    from pcrfs.storage.objclient import is_remote
    return is_remote(path)


def _open(a, **kw):
    from pcrfs.dataset import open_dataset
    if _is_remote(a.dst):
        kw["remote"] = _remote_opts(a)
    return open_dataset(a.dst, **kw)


def _cmd_build(a) -> int:
    from pcrfs.builder.builder import BuildOptions, build, finalize, format_result
    if a.finalize:
        if a.dst is not None:
            raise PcrfsError("--finalize takes only DST: pcrfs build --finalize DST")
        a.dst, a.src = a.src, None
    elif a.dst is None:
        raise PcrfsError("pcrfs build SRC DST: DST is missing")
    part = None
    if a.part:
        try:
            i, n = (int(x) for x in a.part.split("/"))
        except ValueError:
            raise PcrfsError(f"--part {a.part}: expected i/N, e.g. 0/4") from None
        part = (i, n)
    remote = _remote_opts(a) if (_is_remote(a.dst) or _is_remote(a.src or "")) else None
    opts = BuildOptions(workers=a.workers, images_per_record=a.images_per_record,
                        shuffle_seed=a.shuffle_seed, scans=a.scans,
                        keep_metadata=a.keep_metadata, quality=a.quality, strict=a.strict,
                        resume=a.resume, progress=not a.quiet, max_pixels=a.max_pixels,
                        views=tuple(v for v in a.views.split(",") if v and v != "none"),
                        engine=a.engine, part=part, remote=remote, overwrite=a.overwrite,
                        tmp_dir=a.tmp_dir, restart_rows=a.restart_rows, restart_bytes=a.restart_bytes)
    try:
        res = finalize(a.dst, opts) if a.finalize else build(a.src, a.dst, opts)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EACCES):
            raise
        where = f" ({e.filename})" if e.filename else ""
        raise PcrfsError(f"build failed: {e.strerror}{where}. Nothing complete was written to "
                         f"{a.dst}; the finished part is kept in {a.dst}.partial: fix the cause, "
                         f"then run the same command with --resume") from None
    print(format_result(res))
    return 0


def _push(a, local: str, url: str, overwrite: bool) -> int:
    from pcrfs.admin.push import push
    r = push(local, url, _remote_opts(a), overwrite=overwrite, jobs=a.jobs, progress=not a.quiet,
             engine=a.engine)
    print(f"pushed to {r.url}: {r.uploaded} objects ({r.bytes} bytes) uploaded, {r.skipped} "
          f"already there, {r.deleted} stale removed; manifest last")
    return 0


def _cmd_push(a) -> int:
    return _push(a, a.dst, a.url, a.overwrite)


def _cmd_info(a) -> int:
    from pcrfs.admin.quality import format_quality, recommend
    from pcrfs.builder.summary import format_summary
    if not 0 < a.threshold <= 1 or a.sample < 1:
        raise PcrfsError("--threshold must be in (0, 1] and --sample at least 1")
    with _open(a) as ds:
        m = dict(ds.manifest)
        idx = ds.index.data_bytes()
        m["index_bytes_per_image"] = round(idx / max(m["images"], 1), 1)
        q = _quality(a, ds)
        if q is not None:
            m["quality"] = dict(q, threshold=a.threshold, recommended=recommend(q["views"], a.threshold))
        if a.json:
            print(json.dumps(m, indent=2, sort_keys=True))
            return 0
        print(f"dataset     {ds.url or os.path.abspath(a.dst)}")
        print(f"uuid        {m['uuid']}")
        print(f"format      pcrfs v{m['format_version']}, created {m['created']}")
        print(f"images      {m['images']} in {m['records']} records "
              f"({m['build']['images_per_record']} per record)")
        print(f"classes     {len(m['classes'])}")
        print(f"groups      {m['groups']} (views {', '.join(ds.all_views)})")
        print(f"restarts    {restart_line(m)}")
        print(f"size        {m['dataset_bytes']} bytes of records; sources {m['source_bytes']} "
              f"bytes ({m['dataset_bytes'] / max(m['source_bytes'], 1):.3f}x)")
        print(f"index       {idx} bytes, {m['index_bytes_per_image']} bytes per image")
        print()
        print(format_summary(m["summary"]))
        if q is not None:
            print()
            print(format_quality(q, a.threshold))
    return 0


def restart_line(manifest: dict) -> str:
    b = manifest.get("build", {}).get("restart_bytes", 0)
    if b:
        return f"each scan's intervals of at most {b} entropy-coded bytes (GPU entropy decoding by interval)"
    n = manifest.get("build", {}).get("restart_rows", 0)
    if not n:
        return "none (scans entropy-decode whole: decode_jpeg's CPU hybrid path)"
    return f"every {n} MCU row{'s' if n > 1 else ''} of every scan (GPU entropy decoding by interval)"


def _quality(a, ds) -> dict | None:
    """The MS-SSIM report: stored if one matches, computed (and stored) for --quality."""
    from pcrfs.admin.quality import compute_quality, load_quality, plot_quality, quality_path, store_quality
    root = ds.root  # for a URL: the local metadata copy
    q = load_quality(root, ds.manifest["uuid"], a.sample) if not a.recompute else None
    if q is None and not a.quality:
        # plain `info`: show whatever report is stored, for any sample size
        try:
            with open(quality_path(root)) as f:
                q = json.load(f)
        except (OSError, ValueError):
            return None
        return q if q.get("uuid") == ds.manifest["uuid"] else None
    if q is None:
        q = compute_quality(ds, a.sample, progress=not a.json and sys.stderr.isatty())
        try:
            store_quality(root, q)
        except OSError as e:  # a read-only dataset still gets its answer
            print(f"pcrfs: could not store {quality_path(root)}: {e.strerror}", file=sys.stderr)
    if a.plot:
        plot_quality(q, a.plot, a.threshold)
    return q


def _cmd_verify(a) -> int:
    from pcrfs.admin.verify import verify, verify_remote
    if _is_remote(a.dst):
        rep = verify_remote(a.dst, _remote_opts(a), tmp_dir=a.tmp_dir, progress=not a.quiet)
    else:
        from pcrfs.format.manifest import read_manifest
        if not os.path.isdir(a.dst):
            raise PcrfsError(f"{a.dst}: no such dataset directory")
        try:
            read_manifest(a.dst)
        except PcrfsError as e:
            if "not a pcrfs dataset" in str(e):
                raise
        rep = verify(a.dst)
    for p in rep.problems:
        print(f"PROBLEM {p}")
    for path, why in sorted(rep.damaged.items()):
        print(f"DAMAGED {path}: {why}")
    for n in rep.notes:
        print(f"note: {n}")
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(rep.files_checked.items()))
    print(f"files checked: {kinds}")
    print(f"checked {rep.images_checked} images, {rep.segments_checked} segments: "
          f"{'OK' if rep.ok else f'{len(rep.damaged)} damaged, {len(rep.problems)} problems'}")
    return 0 if rep.ok else 1


def _cmd_materialize(a) -> int:
    from pcrfs.liquid.materialize import materialize
    if a.format != "raw":
        raise PcrfsError(f"materialize: no format {a.format!r} (formats: raw)")
    out = materialize(a.dst, a.fraction, jobs=a.jobs, progress=not a.quiet, engine=a.engine)
    print(f"raw share {out['fraction']}: {out['images']} images, {out['bytes']} bytes in "
          f"{len(out['files'])} packs ({out['decoded']} decoded, {out['reused']} reused, "
          f"{out['kept_packs']} packs already made)")
    return 0


def _cmd_tune(a) -> int:
    from pcrfs.liquid.tune import tune
    from pcrfs.storage.throttle import parse_rate, parse_size
    try:
        bandwidth = parse_rate(a.bandwidth) if a.bandwidth else None
    except ValueError as e:
        raise PcrfsError(f"--bandwidth: {e}") from None
    try:
        budget = parse_size(a.budget)
    except ValueError as e:
        raise PcrfsError(f"--budget: {e}") from None
    tune(a.mnt, transform=a.transform, workers=a.workers, sample=a.sample, store=not a.dry_run,
         remote=_remote_opts(a), min_fidelity=a.min_fidelity, bandwidth=bandwidth,
         budget=budget, epochs=a.epochs)
    return 0


def _cmd_export(a) -> int:
    from pcrfs.admin.export import export_view
    with _open(a) as ds:
        try:
            n, errors = export_view(ds, a.view, a.out)
        except KeyError as e:
            raise PcrfsError(str(e.args[0])) from None
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    print(f"exported {n} files of view {a.view} to {a.out}")
    return 1 if errors else 0


def _cmd_reindex(a) -> int:
    import uuid

    from pcrfs.builder.indexer import reindex
    from pcrfs.format.manifest import read_manifest
    m = read_manifest(a.dst)
    st = reindex(a.dst, uuid.UUID(m["uuid"]))
    print(f"reindexed {a.dst}: {st.images} images in {st.records} records, "
          f"{st.index_bytes / max(st.images, 1):.0f} index bytes per image")
    return 0


def _cmd_mount(a) -> int:
    from pcrfs.fs.mount import mount
    from pcrfs.storage.throttle import parse_rate, parse_size
    try:
        opts = {"cache_size": parse_size(a.cache_size),
                "bandwidth_limit": parse_rate(a.bandwidth_limit) if a.bandwidth_limit else None,
                "cache_dir": None if a.cache_dir == "none" else os.path.abspath(a.cache_dir),
                "cache_dir_size": parse_size(a.cache_dir_size)}
    except ValueError as e:
        raise PcrfsError(str(e)) from None
    if _is_remote(a.dst):
        if opts["cache_dir"] is None:
            raise PcrfsError("a remote dataset needs --cache-dir (its index and fetched extents "
                             "are kept there)")
        opts["remote"] = _remote_opts(a)
    if a.shard:
        from pcrfs.cluster.shard import parse_shard
        try:
            opts["shard"] = parse_shard(a.shard, a.shard_seed)
        except ValueError as e:
            raise PcrfsError(str(e)) from None
    if a.peers:
        from pcrfs.storage.peers import parse_peers
        opts["peers"] = parse_peers(a.peers)
    if a.peer_bandwidth_limit:
        try:
            opts["peer_bandwidth_limit"] = parse_rate(a.peer_bandwidth_limit)
        except ValueError as e:
            raise PcrfsError(str(e)) from None
    if a.peer_key:
        from pcrfs.storage.peers import read_key
        read_key(a.peer_key)            # refused now, in the user's terminal
        opts["peer_key_file"] = os.path.abspath(a.peer_key)
    options = [*(a.o or []), *([f"fidelity={a.fidelity}"] if a.fidelity else [])]
    return mount(a.dst, a.mnt, foreground=a.foreground, options=options, dataset_opts=opts,
                 logfile=a.log, debug=a.debug,
                 workers=a.workers or (32 if _is_remote(a.dst) else 8), argv=a.argv)


def _cmd_warm(a) -> int:
    from pcrfs.control import warm
    rep = warm(a.mnt, a.view, progress=not a.quiet)
    w = rep["warm"]
    print(f"node {rep['node']}/{rep['nodes']}: warmed {w['done']} owned records at q{w['k']} "
          f"in {w.get('seconds', 0):.1f} s: {w['gets']} GETs, {w['bytes']} bytes fetched, "
          f"{w['reused']} already held, {w['published']} segments published to the peer cache")
    for e in w["errors"]:
        print(f"error: {e}", file=sys.stderr)
    return 1 if w["errors"] else 0


def _cmd_set_fidelity(a) -> int:
    from pcrfs.control import get_fidelity, set_fidelity
    before = get_fidelity(a.mnt)
    if a.fidelity is None:
        print(f"q{before}")
        return 0
    try:
        after = set_fidelity(a.mnt, a.fidelity)
    except (ValueError, PermissionError) as e:
        raise PcrfsError(str(e)) from None
    print(f"{os.path.join(a.mnt, 'dynamic')}: q{before} -> q{after}")
    return 0


def _cmd_status(a) -> int:
    from pcrfs.control import read_stats
    from pcrfs.telemetry.status import format_status
    stats = read_stats(a.mnt)
    print(json.dumps(stats, indent=2, sort_keys=True) if a.json else format_status(a.mnt, stats))
    return 0


def _cmd_upgrade(a) -> int:
    from pcrfs.fs.supervisor import upgrade
    old, new = upgrade(a.mnt, a.timeout)
    print(f"{a.mnt}: daemon {old} -> {new}")
    return 0


def _cmd_umount(a) -> int:
    from pcrfs.fs.mount import umount
    umount(a.mnt, a.lazy)
    return 0


def _default_cache_dir() -> str:
    from pcrfs.storage.diskcache import default_cache_dir
    return default_cache_dir()


def _add_remote_args(p: argparse.ArgumentParser, title: str | None = None) -> None:
    g = p.add_argument_group(title or "remote datasets (s3://bucket/prefix, gs://bucket/prefix, "
                             "az://container/prefix, http(s)://host/path)")
    g.add_argument("--endpoint", default=None, metavar="URL",
                   help="s3://: an S3-compatible endpoint, e.g. http://127.0.0.1:8333 (default: "
                        "AWS_ENDPOINT_URL, the AWS profile, or AWS itself); gs://: a GCS "
                        "endpoint or emulator (default: STORAGE_EMULATOR_HOST or Google); "
                        "az://: the blob endpoint, e.g. http://127.0.0.1:10000/devstoreaccount1 "
                        "(default: the connection string's, or the account's)")
    g.add_argument("--region", default=None, help="S3 region (default: AWS_REGION, the profile, "
                                                  "or us-east-1)")
    g.add_argument("--addressing", choices=["auto", "path", "virtual"], default="auto",
                   help="S3 bucket addressing; auto: path-style with --endpoint, else virtual-hosted")
    g.add_argument("--io-timeout", type=float, default=DEFAULT_IO_TIMEOUT, metavar="SECONDS",
                   help="bound on one remote read, retries included; then EIO (default %(default)g)")
    g.add_argument("--no-sign-request", action="store_true",
                   help="anonymous requests (public buckets)")


def _cmd_csi(a) -> int:
    import logging

    from pcrfs.csi.plugin import serve
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s pcrfs-csi %(levelname)s %(message)s")
    return serve(a.endpoint, a.node_id, a.state_dir)


def _add_engine_arg(p, what: str, shared: bool = False) -> None:
    p.add_argument("--engine", default="local", metavar="local|dask[=ADDRESS]",
                   help=f"where {what} run: this process (default), an embedded Dask "
                        f"LocalCluster, or the Dask scheduler at ADDRESS (tcp://host:8786)"
                        + ("; Dask workers must see DST at the same path" if shared else ""))


def parser() -> argparse.ArgumentParser:
    from pcrfs import __version__
    p = argparse.ArgumentParser(prog="pcrfs", description=__doc__)
    p.add_argument("--version", action="version", version=f"pcrfs {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)

    b = sub.add_parser("build", help="convert an ImageFolder tree into a PCR dataset")
    b.add_argument("src", help="ImageFolder tree: a directory, or s3://, gs://, az:// prefix")
    b.add_argument("dst", nargs="?", help="new dataset: a directory, or s3://, gs://, az:// prefix")
    b.add_argument("--workers", type=int, default=0,
                   help="transcoding threads (engine local) or worker processes (engine dask "
                        "without an address); default: all cores")
    _add_engine_arg(b, "record tasks")
    b.add_argument("--part", default=None, metavar="i/N",
                   help="build only the i-th of N slices of the records (job arrays), then "
                        "`pcrfs build --finalize DST` once every part is done")
    b.add_argument("--finalize", action="store_true",
                   help="pcrfs build --finalize DST: index and publish a --part build")
    b.add_argument("--images-per-record", type=int, default=1024, metavar="N",
                   help="images per record file (default 1024): the unit of a record's GET "
                        "and of a --shard node's ownership")
    b.add_argument("--shuffle-seed", type=int, default=None,
                   help="shuffle which images share a record (default: sorted order)")
    b.add_argument("--scans", default="default", help="'default' or a jpegtran -scans file")
    b.add_argument("--restart-rows", type=int, default=3, metavar="N",
                   help="a restart marker every N MCU rows of every scan, so each interval can "
                        "be entropy-decoded on its own (pcrfs.torch.decode_jpeg on the GPU); "
                        "lossless; 0: none (default 3: the smallest N whose markers cost at "
                        "most 2%% of the stored bytes, bench/results/gpu_decode.json)")
    b.add_argument("--restart-bytes", type=int, default=0, metavar="B",
                   help="instead of --restart-rows: each scan restarts as often as keeps its "
                        "intervals within B entropy-coded bytes (where 4 MCUs do), so the "
                        "GPU's longest interval, which bounds its entropy decoding, is short "
                        "in every scan; lossless; transcoding takes two encodes (300: about "
                        "the bytes of --restart-rows 3, intervals 5x shorter)")
    b.add_argument("--keep-metadata", choices=["none", "default", "all"], default="default",
                   help="default keeps JFIF, Adobe and ICC; all keeps EXIF and comments too")
    b.add_argument("--quality", type=int, default=95, help="JPEG quality for non-JPEG inputs")
    b.add_argument("--strict", action="store_true", help="fail if any file must be skipped")
    b.add_argument("--resume", action="store_true", help="continue an interrupted build")
    b.add_argument("--max-pixels", type=int, default=178_956_970, metavar="N",
                   help="skip images whose header declares more pixels (decompression bombs; "
                        "default 178956970, where Pillow refuses)")
    b.add_argument("--views", default="l3", metavar="LIST",
                   help="format views to prepare (their exact sizes are computed now): 'l3' "
                        "(default) or 'none'")
    b.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    b.add_argument("--tmp-dir", default=None, metavar="DIR",
                   help="with a remote DST: where the index is made before upload")
    b.add_argument("--overwrite", action="store_true",
                   help="with a remote DST: replace another dataset stored there")
    _add_remote_args(b)
    b.set_defaults(func=_cmd_build)

    cs = sub.add_parser("csi", help="serve the Kubernetes CSI node plugin (docs/KUBERNETES.md)")
    cs.add_argument("--endpoint", default="unix:///csi/csi.sock",
                    help="where kubelet connects (default unix:///csi/csi.sock)")
    cs.add_argument("--node-id", required=True, help="this node's name, as kubelet knows it")
    cs.add_argument("--state-dir", default="/var/lib/pcrfs-csi",
                    help="where the published volumes are recorded (survives plugin restarts)")
    cs.set_defaults(func=_cmd_csi)

    pu = sub.add_parser("push", help="upload a dataset to s3://, gs:// or az:// (manifest last)")
    pu.add_argument("dst", help="local dataset directory")
    pu.add_argument("url", help="s3://bucket/prefix, gs://bucket/prefix or az://container/prefix")
    pu.add_argument("--overwrite", action="store_true", help="replace another dataset stored there")
    pu.add_argument("--jobs", type=int, default=8,
                    help="parallel uploads (engine local), or worker processes (engine dask "
                         "without an address); default 8")
    _add_engine_arg(pu, "uploads", shared=True)
    pu.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    _add_remote_args(pu)
    pu.set_defaults(func=_cmd_push)

    i = sub.add_parser("info", help="manifest and per-fidelity size table")
    i.add_argument("dst", help="the dataset: a directory, or an s3://, gs://, az:// or http(s):// URL")
    i.add_argument("--json", action="store_true", help="the same as JSON")
    i.add_argument("--quality", action="store_true",
                   help="MS-SSIM of each view against full fidelity on a sample (computed once, "
                        "then stored in DST/quality.json)")
    i.add_argument("--sample", type=int, default=500, help="images in the --quality sample")
    i.add_argument("--threshold", type=float, default=0.95,
                   help="recommend the lowest view with mean MS-SSIM at least this")
    i.add_argument("--recompute", action="store_true", help="ignore a stored quality report")
    i.add_argument("--plot", metavar="PNG", help="with --quality: plot bytes and MS-SSIM vs k")
    _add_remote_args(i)
    i.set_defaults(func=_cmd_info)

    v = sub.add_parser("verify", help="check every checksum and record/index/manifest agreement")
    v.add_argument("dst", help="the dataset: a directory, or an s3://, gs://, az:// or http(s):// URL")
    v.add_argument("--tmp-dir", default=None, metavar="DIR",
                   help="with a remote DST: where its objects are downloaded to be checked "
                        "(needs the dataset's size free; removed afterwards)")
    v.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    _add_remote_args(v)
    v.set_defaults(func=_cmd_verify)

    mz = sub.add_parser("materialize", help="store the raw (PPM) files of a share of the images "
                        "next to the records (for MNT/raw and MNT/mix)")
    mz.add_argument("dst", help="a local dataset directory (push it again after)")
    mz.add_argument("format", help="raw")
    mz.add_argument("--fraction", type=float, required=True, metavar="R",
                    help="share of the images, 0..1 (a larger R contains every smaller one)")
    mz.add_argument("--jobs", type=int, default=None,
                    help="decoding threads (engine local) or worker processes (engine dask "
                         "without an address); default: cores")
    _add_engine_arg(mz, "pack tasks", shared=True)
    mz.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    mz.set_defaults(func=_cmd_materialize)

    tu = sub.add_parser("tune", help="profile a mount and choose MNT/mix's raw share and fidelity "
                        "(Liquid's profiler, both ways)")
    tu.add_argument("mnt", help="the mount point of a pcrfs mount")
    tu.add_argument("--transform", choices=("imagenet", "fused", "none"), default="imagenet",
                    help="what training does per image: torchvision's ImageNet transform "
                         "(Pillow), the fused C decode-crop-resize of "
                         "pcrfs.torch.FastImageFolder, or decode only")
    tu.add_argument("--workers", type=int, default=None,
                    help="decoding processes of the training job (default: cores)")
    tu.add_argument("--sample", type=int, default=200, help="images measured per format")
    tu.add_argument("--min-fidelity", type=int, default=None, metavar="K",
                    help="let the choice lower k down to K whenever that is faster, CPU-bound "
                    "too (default: below qG only when JPEG alone is I/O-bound)")
    tu.add_argument("--bandwidth", metavar="RATE", default=None,
                    help="the link's rate the choice is for (e.g. 50M: 50 MB/s), as a mount's "
                         "--bandwidth-limit would set it (default: the mount's limit, else "
                         "what reading through the mount gives)")
    tu.add_argument("--budget", metavar="SIZE", default="1G",
                    help="the most the probes may write to the mount's disk caches (raw files "
                         "not materialized, MNT/bK files); a format whose bound passes it is "
                         "not probed (default 1G; the bound is printed first)")
    tu.add_argument("--epochs", type=int, default=30, metavar="N",  # liquid.tune.DEFAULT_EPOCHS
                    help="epochs the job will read through this mount's disk cache: a bK "
                         "file is made once, on its first read, so its making is charged "
                         "1/N per epoch (default 30; 1 for a single cold epoch)")
    tu.add_argument("--dry-run", action="store_true", help="print the choice, store nothing")
    _add_remote_args(tu, "a mounted remote dataset: the credentials that write its "
                     "liquid.json back to the bucket (--dry-run needs none)")
    tu.set_defaults(func=_cmd_tune)

    e = sub.add_parser("export", help="write a view as plain files")
    e.add_argument("dst", help="the dataset: a directory, or an s3://, gs://, az:// or http(s):// URL")
    e.add_argument("view", help="q1..qG, l3, raw or mix")
    e.add_argument("out", help="the directory to write the tree to (made if missing)")
    _add_remote_args(e)
    e.set_defaults(func=_cmd_export)

    m = sub.add_parser("mount", help="mount DST read-only at MNT (views q1..qG, l3, raw, mix, "
                       "dynamic)")
    m.add_argument("dst", help="the dataset: a directory, or an s3://, gs://, az:// or "
                   "http(s):// URL")
    m.add_argument("mnt", help="an existing, empty directory (or /dev/fd/N: a FUSE "
                   "descriptor another process mounted)")
    m.add_argument("-f", "--foreground", action="store_true", help="do not detach")
    from pcrfs.fs.options import OPTIONS
    m.add_argument("-o", action="append", metavar="OPTS",
                   help="mount options, comma-separated (docs/OPTIONS.md says what each does): "
                        "allow_other, default_permissions, ro, nonempty, "
                        + ", ".join(o.usage for o in OPTIONS.values()))
    from pcrfs.fs.options import DATASET_FLAGS, SHARD_FLAGS
    for flag, kw in DATASET_FLAGS.items():
        if flag not in SHARD_FLAGS:
            m.add_argument(flag, **(kw | ({"default": _default_cache_dir()}
                                          if flag == "--cache-dir" else {})))
    m.add_argument("--log", default=None, metavar="FILE",
                   help="append the daemon's log to FILE (default: none once detached; "
                        "stderr with -f, the journal under systemd)")
    m.add_argument("--debug", action="store_true",
                   help="log at DEBUG level (verbose; for bug reports)")
    m.add_argument("--workers", type=int, default=0,
                   help="read threads (default 8; 32 for a remote dataset, whose reads mostly wait)")
    g = m.add_argument_group("many nodes, one bucket (docs/SCALE.md)")
    for flag in SHARD_FLAGS:
        g.add_argument(flag, **DATASET_FLAGS[flag])
    _add_remote_args(m)
    m.set_defaults(func=_cmd_mount)

    w = sub.add_parser("warm", help="fetch a --shard node's owned records into its disk cache "
                       "and peer cache (one GET per record)")
    w.add_argument("mnt", help="the mount point of a --shard mount")
    w.add_argument("--view", default=None, metavar="qK",
                   help="the fidelity to warm (default: the full view); a later higher one "
                   "fetches only the missing groups")
    w.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    w.set_defaults(func=_cmd_warm)

    from pcrfs.cluster.model import add_parser as add_model
    add_model(sub)

    st = sub.add_parser("status", help="health of a mount: uptime, bytes per view, cache, errors")
    st.add_argument("mnt", help="the mount point of a pcrfs mount")
    st.add_argument("--json", action="store_true", help="the raw .pcrfs/stats.json")
    st.set_defaults(func=_cmd_status)

    up = sub.add_parser("upgrade", help="replace a supervised mount's daemon (the default) "
                        "with the pcrfs installed now, without unmounting")
    up.add_argument("mnt", help="the mount point of a pcrfs mount")
    up.add_argument("--timeout", type=float, default=120.0,
                    help="seconds to wait for the new daemon (default 120)")
    up.set_defaults(func=_cmd_upgrade)

    u = sub.add_parser("umount", help="unmount (works on stale mounts too)")
    u.add_argument("mnt", help="the mount point of a pcrfs mount")
    u.add_argument("--lazy", action="store_true",
                   help="detach now even if files are open (umount -l); the daemon exits "
                        "when the last one is closed")
    u.set_defaults(func=_cmd_umount)

    f = sub.add_parser("set-fidelity", help="switch MNT/dynamic to another fidelity, no remount")
    f.add_argument("mnt", help="the mount point of a pcrfs mount")
    f.add_argument("fidelity", nargs="?",
                   help="q1..qG, 1..G, or full (qG) (omit to print the current one)")
    f.set_defaults(func=_cmd_set_fidelity)

    r = sub.add_parser("reindex", help="rebuild index.lmdb from the records")
    r.add_argument("dst", help="a local dataset directory")
    r.set_defaults(func=_cmd_reindex)
    return p


def _fstab_form(argv: list[str]) -> list[str]:
    """mount.fuse3 (mount -t fuse.pcrfs, fstab, systemd .mount units) runs
    `pcrfs DST MNT -o OPTS`: that is `pcrfs mount DST MNT -o OPTS`."""
    commands = set(parser()._subparsers._group_actions[0].choices)  # noqa: SLF001
    if len(argv) >= 2 and argv[0] not in commands and not argv[0].startswith("-"):
        return ["mount", *argv]
    return argv


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = _fstab_form(sys.argv[1:] if argv is None else argv)
    if not args:                # a bare `pcrfs`: what it does, not a missing-argument error
        p.print_help()
        return 0
    a, extra = p.parse_known_args(args)
    a.argv = args               # a supervised mount runs its daemons with them again
    # `build SRC -q DST`: argparse gives an optional positional (DST may be absent, for
    # `build --finalize DST`) nothing once an option splits the positionals
    if a.cmd == "build" and a.dst is None and len(extra) == 1 and not extra[0].startswith("-"):
        a.dst, extra = extra[0], []
    if extra:
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return a.func(a)
    except PcrfsError as e:
        print(f"pcrfs: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pcrfs: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:     # `pcrfs status MNT | head`: the reader left; say nothing
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())   # (so the exit's flush cannot fail again)
        return 141


if __name__ == "__main__":
    sys.exit(main())
