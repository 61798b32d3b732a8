"""pcrfs side by side with the loaders users pick instead (issue 40): WebDataset, LitData,
MosaicML Streaming, FFCV and DALI, and plain ImageFolder files, on the same images.

Every system converts the same ImageFolder source with its own writer (images/s and stored
bytes), then feeds the same input: RandomResizedCrop(224), flip and normalize as float
batches of 64 with 2 loader processes (FFCV and DALI: their own operations and 2 threads,
which is what their users run).  pcrfs runs unmodified ImageFolder over the mount: q10, the
fidelity `pcrfs tune --min-fidelity 1` picks (its MS-SSIM beside it) and mix.

Regimes, each the median of >= 5 rounds in which the systems take turns:
  cpu_local            the converted copies on local disk, warm: CPU-bound
  s3_5MBps ...         each system reads one SeaweedFS through its own S3 client, cold, under
                       one bandwidth limit applied outside them all (tc on the S3 port)
  second_epoch_30pct   a second epoch from S3 with each system's cache bounded at 30% of the
                       dataset; the hit ratio is 1 - epoch 2's bytes / epoch 1's, both
                       counted by the same tc class
  gpu                  decode on the GPU (bench/peers_gpu.py): pcrfs's l3 files through
                       decode_batch against nvJPEG on the source JPEGs; measured where CUDA
                       is, else taken from the last peers_gpu.json of a GPU host

The peers run in .venv-peers (bench/peer_arms.py), so their pins (numpy < 2.2 for Mosaic)
never reach pcrfs's own environment."""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

from bench.common import REPO, Mounted, du, pcrfs, pyplot, write_result
from bench.mount import file_list, read_files
from bench.remote_reads import s3_server
from testkit.pages import drop_page_cache

SYSTEMS = ["pcrfs", "imagefolder", "webdataset", "litdata", "mosaicml-streaming", "ffcv", "dali"]
PEERS = SYSTEMS[2:]
PEERS_PY = REPO / ".venv-peers" / "bin" / "python"
ARMS = Path(__file__).with_name("peer_arms.py")
# the limits, and 5 MB/s: about the bytes per core of 50 MB/s on a 16-core host,
# since on 2 cores every system here is CPU-bound long before 25 MB/s
# the sweep of issue 82 (X = W / E[s(x)] drawn over it), the targets' limits first: a
# stopped run keeps them
LIMITS_MB = (50, 100, 25, 200)
BUCKET = "peers"
TORCHVISION = {"imagefolder", "webdataset", "litdata", "mosaicml-streaming"}


class PeerError(Exception):
    """A system that failed: its row keeps the error."""


def items_of(src: Path) -> list[list]:
    """[path, label] in ImageFolder's order and labels (sorted classes, sorted files)."""
    from torchvision import datasets
    return [[p, c] for p, c in datasets.ImageFolder(str(src)).samples]


def _env() -> dict:
    """The peers' processes: no warnings or progress bars in their output."""
    return dict(os.environ, PYTHONWARNINGS="ignore", TQDM_DISABLE="1")


def call(op: str, system: str, args: dict, timeout: float = 3600) -> dict:
    """bench/peer_arms.py in the peers' environment; PeerError with its stderr's tail."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(args, f)
        f.flush()
        try:
            p = subprocess.run([str(PEERS_PY), str(ARMS), op, system, f.name], capture_output=True,
                               text=True, cwd="/", timeout=timeout,
                               env=_env())
        except subprocess.TimeoutExpired as e:
            raise PeerError(f"{op} {system}: no result in {timeout:.0f} s") from e
    if p.returncode:
        log = Path(args.get("out") or "/tmp").parent / f"{op}-{system}.stderr"
        log.write_text(p.stderr)
        lines = [x.strip() for x in p.stderr.strip().splitlines() if x.strip()]
        err = next((x for x in reversed(lines) if "Error" in x or "error" in x), lines[-1] if lines else "")
        raise PeerError(f"{op} {system} exited {p.returncode}: {err} (stderr: {log})")
    return json.loads(p.stdout.strip().splitlines()[-1])


class Worker:
    """One long-lived peers process that answers calls in turn (peer_arms.py serve): for
    the tests' tiny runs, where a process per call (torch's import) costs more than the
    work.  The bench itself starts a fresh process for every call."""

    def __init__(self, log: Path):
        self.log = open(log, "w")
        self.proc = subprocess.Popen([str(PEERS_PY), str(ARMS), "serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, cwd="/",
                                     env=_env())

    def __call__(self, op: str, system: str, args: dict, timeout: float = 3600) -> dict:
        self.proc.stdin.write(json.dumps({"op": op, "system": system, "args": args}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise PeerError(f"{op} {system}: the peers process exited {self.proc.wait()} "
                            f"(stderr: {self.log.name})")
        res = json.loads(line)
        if "error" in res:
            raise PeerError(f"{op} {system}: {res['error']} (stderr: {self.log.name})")
        return res["ok"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.log.close()


# -- conversion ------------------------------------------------------------------------------
def convert_all(src: Path, items: list, work: Path, call=call) -> dict:
    """Each system's writer over the same source: images/s, stored bytes, or its error."""
    out = {}
    ds = work / "pcrfs"
    shutil.rmtree(ds, ignore_errors=True)
    t0 = time.perf_counter()
    pcrfs("build", src, ds, "-q")
    out["pcrfs"] = {"images_per_s": len(items) / (time.perf_counter() - t0),
                    "stored_bytes": du(ds), "path": str(ds)}
    out["imagefolder"] = {"images_per_s": None, "stored_bytes": sum(os.path.getsize(p) for p, _ in items),
                          "path": str(src)}
    # shards of about 1/24 of the dataset (at most 64 MB, Mosaic's default): enough for 2
    # workers to stream, and for a cache of 30% to hold whole shards (Mosaic wants 4)
    shard_bytes = min(64 << 20, max(64 << 10, out["imagefolder"]["stored_bytes"] // 24))
    for system in PEERS:
        dst = work / system
        shutil.rmtree(dst, ignore_errors=True)
        try:
            r = call("convert", system, {"items": items, "out": str(dst), "workers": 2,
                                         "shard_bytes": shard_bytes})
            out[system] = {"images_per_s": None if system == "dali" else r["images"] / r["seconds"],
                           "stored_bytes": r["stored_bytes"], "path": str(dst)}
        except PeerError as e:
            out[system] = {"error": str(e)}
        print(f"  converted {system}: {out[system]}", flush=True)
    return out


def pcrfs_choice(ds: Path, mnt: Path, sample: int) -> dict:
    """The fidelity and raw share `pcrfs tune --min-fidelity 1` picks (stored in the
    dataset), the raw packs for that share, and the MS-SSIM of each view; and the k that
    `--transform fused` picks for FastImageFolder (not stored)."""
    with Mounted(ds, mnt):
        from pcrfs.liquid.tune import tune
        # FastImageFolder's own choice first (not stored): the k its fused path pays for
        fused = tune(str(mnt), transform="fused", workers=2, sample=min(200, sample),
                     log=lambda *_: None, min_fidelity=1, store=False)
        c = tune(str(mnt), workers=2, sample=min(200, sample), log=lambda *_: None,
                 min_fidelity=1)
    pcrfs("materialize", ds, "raw", "--fraction", c["share"], "-q")
    info = json.loads(pcrfs("info", ds, "--quality", "--sample", "40", "--json"))
    ssim = {v["view"]: v["ms_ssim_mean"] for v in info["quality"]["views"]}
    return {"fidelity": c["fidelity"], "share": c["share"], "ms_ssim": ssim,
            "view": tuned_view(c),
            "fused_fidelity": fused["fidelity"], "fused_share": fused["share"],
            # FastImageFolder's root: b_k or q_k (it reads JPEG files only)
            "fused_view": f"b{fused['seq']}" if fused.get("seq") else f"q{fused['fidelity']}",
            "ms_ssim_tuned": ssim.get(f"q{c['fidelity']}"),
            "ms_ssim_fused_tuned": ssim.get(f"q{fused['fidelity']}"),
            "view_bytes": view_bytes(info),
            "stored_bytes_with_raw_packs": du(ds)}


def tuned_view(c: dict) -> str:
    """The directory `pcrfs tune` (the ImageFolder transform) says to train on: b_k when it
    chose the baseline-coded view, mix/ when it chose a raw share, else q_k."""
    if c.get("seq"):
        return f"b{c['seq']}"
    return "mix" if c.get("share") else f"q{c['fidelity']}"


def view_bytes(info: dict) -> dict[str, int]:
    """Each view's bytes over the whole dataset (`pcrfs info --json`: the sum of its files'
    sizes, what `du -sb MNT/qk` gives)."""
    return dict(info["summary"]["total_bytes"])


# -- regimes ---------------------------------------------------------------------------------
ARMS_ALL = [("pcrfs", "q10"), ("pcrfs", "tuned"), ("pcrfs", "mix"), ("imagefolder", "files"),
            *((s, s) for s in PEERS)]
# FastImageFolder (the fused C decode-crop-resize, issue 54) over the tuned view, q10 and
# the source JPEGs; over S3 the first two read the S3 mount, the sources are fetched object
# by object from the bucket (the copy DALI reads: peer_arms._ObjectLoader)
FUSED_ARMS = [("pcrfs", "fused-tuned"), ("pcrfs", "fused-q10"), ("pcrfs", "fused-source")]
FUSED_S3_ARMS = FUSED_ARMS


def _view(arm: str, choice: dict) -> str:
    if arm == "fused-tuned":       # `pcrfs tune --transform fused`'s k (and coding)
        return choice.get("fused_view") or f"q{choice.get('fused_fidelity', choice['fidelity'])}"
    return {"q10": "q10", "tuned": choice.get("view") or f"q{choice['fidelity']}",
            "mix": "mix", "fused-q10": "q10"}[arm]


def cpu_local(conv, choice, items, work, rounds, batch=64, check=False, call=call) -> list[dict]:
    """Warm local copies, CPU-bound.  check: each row keeps its last epoch's checks (the
    test's tiny run: shapes, dtypes, label counts, colours)."""
    samples: dict[tuple, list] = {}
    checks: dict[tuple, dict] = {}
    errors: dict[tuple, str] = {}
    todo = ARMS_ALL + FUSED_ARMS
    with Mounted(conv["pcrfs"]["path"], work / "mnt-peers") as m:
        for r in range(rounds):
            order = todo[r % len(todo):] + todo[: r % len(todo)]
            for system, arm in order:
                if (system, arm) in errors or "error" in conv[system]:
                    continue
                a = {"items": items, "out": conv[system]["path"], "batch": batch, "workers": 2,
                     "check": check}
                runs = system
                if arm == "fused-source":
                    runs, a["root"] = "pcrfs-fused", conv["imagefolder"]["path"]
                elif system == "pcrfs":
                    a["root"] = str(m.mnt / _view(arm, choice))
                    runs = "pcrfs-fused" if arm.startswith("fused-") else system
                elif system == "imagefolder":
                    a["root"] = conv[system]["path"]
                try:
                    res = call("epoch", runs, a)
                    samples.setdefault((system, arm), []).append(res["rate"])
                    checks[(system, arm)] = {k: res.get(k) for k in ("shapes", "labels",
                                                                      "colour_miss", "images")}
                except PeerError as e:
                    errors[(system, arm)] = str(e)
            print(f"  cpu_local round {r + 1}/{rounds} done", flush=True)
        profile = None if check else cpu_profile(m.mnt, conv, samples, choice)
    rows = []
    for system, arm in todo:
        rows.append(_row(system, arm, "cpu_local", samples.get((system, arm)), conv,
                         errors.get((system, arm)) or conv[system].get("error"),
                         **({"check": checks.get((system, arm))} if check else {}),
                         **_view_of(system, arm, choice)))
        if arm == "fused-source":
            rows[-1]["stored_bytes"] = conv["imagefolder"]["stored_bytes"]
    if profile:
        rows[0]["profile"] = profile
    return rows


def _view_of(system: str, arm: str, choice: dict) -> dict:
    """What a pcrfs arm read: its view (the sources for fused-source)."""
    if system != "pcrfs":
        return {}
    return {"view": "source" if arm == "fused-source" else _view(arm, choice)}


def cpu_profile(mnt: Path, conv: dict, samples: dict, choice: dict) -> dict:
    """Where an image's CPU time goes: the torchvision pipeline's stages in one thread
    (open + decode, then crop, flip, ToTensor, normalize) over every 10th file of the
    sources, q10 and mix, against each system's core-ms per image in the epochs
    (cores x 1000 / images/s).  FFCV and DALI decode only the crop's region (DALI: ROI
    decoding; FFCV: decode, crop and resize fused in compiled code), and their batches are
    made in threads without pickling tensors between processes."""
    from bench.liquid import stages
    files = {"imagefolder/files": file_list(Path(conv["imagefolder"]["path"]))[::10],
             "pcrfs/q10": file_list(mnt / "q10")[::10], "pcrfs/mix": file_list(mnt / "mix")[::10]}
    for paths in files.values():
        read_files(paths)
    st = stages(files)
    # the fused path in one thread over the same files (sources, q10, the tuned view)
    from bench import fused
    src = Path(conv["imagefolder"]["path"])
    rels = [os.path.relpath(p, src) for p in files["imagefolder/files"]]
    tuned = _view("fused-tuned", choice)
    views = {"source": [Path(p).read_bytes() for p in files["imagefolder/files"]]}
    for v in ("q10", tuned):
        views[v] = [(mnt / v / r).read_bytes() for r in rels]
    fused_profile = fused.profile(views, fused.draw_boxes(views["source"]))
    # the tuner's k moves between runs: a stable name for the docs to cite
    ms = fused_profile["core_ms_per_image"]
    ms["fused_tuned"] = ms[f"fused_{tuned}"]
    fused_profile["tuned_view"] = tuned
    cores = os.cpu_count() or 1
    per = {f"{s}/{a}" if s == "pcrfs" else s: round(1e3 * cores / statistics.median(v), 3)
           for (s, a), v in samples.items() if v}
    return {"stages_ms_one_thread": st, "core_ms_per_image": per,
            "fused_one_thread": fused_profile,
            "method": "stages: bench/liquid.py's, median of 3 passes, files warm; core ms: "
                      f"{cores} cores x 1000 / the epoch's median images/s"}


def _row(system, arm, regime, rates, conv, error=None, **kw) -> dict:
    row = {"system": system, "arm": arm, "regime": regime,
           "images_per_s": round(statistics.median(rates), 1) if rates else None,
           "rounds": rates and [round(x, 1) for x in rates],
           "bytes_read": None,
           # mix/ adds the raw packs `pcrfs materialize` wrote for the tuned share
           "stored_bytes": conv[system].get("stored_bytes_mix" if arm == "mix" else "stored_bytes"),
           "hit_ratio": None, "error": error}
    row.update(kw)
    return row


# -- S3 through one shared limit -------------------------------------------------------------
class Shaper:
    """One HTB class on the loopback that every byte sent from the S3 port passes: the
    shared bandwidth limit and the byte counter of every system alike."""

    def __init__(self, port: int):
        self.port = port

    def _tc(self, *args, check=True):
        return subprocess.run(["tc", *args], check=check, capture_output=True, text=True)

    def set(self, mbytes_per_s: float | None) -> None:
        self.clear()
        rate = f"{int(mbytes_per_s * 8)}mbit" if mbytes_per_s else "100gbit"
        self._tc("qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "10",
                 "r2q", "1000")
        self._tc("class", "add", "dev", "lo", "parent", "1:", "classid", "1:10", "htb",
                 "rate", "100gbit")
        self._tc("class", "add", "dev", "lo", "parent", "1:", "classid", "1:30", "htb",
                 "rate", rate, "ceil", rate, "burst", "256k", "cburst", "256k")
        self._tc("filter", "add", "dev", "lo", "protocol", "ip", "parent", "1:", "prio", "1",
                 "u32", "match", "ip", "sport", str(self.port), "0xffff", "flowid", "1:30")

    def sent(self) -> int:
        out = self._tc("-s", "class", "show", "dev", "lo", "classid", "1:30").stdout
        for line in out.splitlines():
            if line.strip().startswith("Sent"):
                return int(line.split()[1])
        return 0

    def clear(self) -> None:
        self._tc("qdisc", "del", "dev", "lo", "root", check=False)


@contextmanager
def s3(work: Path):
    """bench/remote_reads.py's SeaweedFS (credentials in the environment for the pcrfs mounts),
    a bucket, and the shaper on its S3 port."""
    from testkit.servers import ACCESS_KEY, SECRET_KEY
    with s3_server(work / "seaweed") as server:
        shaper = Shaper(server.s3)
        try:
            server.create_bucket(BUCKET)
            yield shaper, {"endpoint": server.endpoint, "bucket": BUCKET, "key": ACCESS_KEY,
                           "secret": SECRET_KEY}
        finally:
            shaper.clear()


def upload(conv: dict, items: list, remote: dict) -> dict[str, list[str]]:
    """Each system's converted copy under BUCKET/<system>/ (pcrfs with `pcrfs push`; DALI:
    the source files, as it reads them); DALI's keys by item."""
    import obstore
    from obstore.store import S3Store
    store = S3Store(BUCKET, endpoint=remote["endpoint"], region="us-east-1",
                    access_key_id=remote["key"], secret_access_key=remote["secret"],
                    virtual_hosted_style_request=False, client_options={"allow_http": True})
    pcrfs("push", conv["pcrfs"]["path"], f"s3://{BUCKET}/pcrfs", "--endpoint", remote["endpoint"], "-q")
    # the source files, which DALI and FastImageFolder's fused-source arm read
    src = Path(conv["imagefolder"]["path"])
    keys = {"dali": [str(Path(p).relative_to(src)) for p, _ in items]}
    for p, k in zip((p for p, _ in items), keys["dali"], strict=True):
        obstore.put(store, f"dali/{k}", Path(p).read_bytes())
    for system in PEERS:
        if "error" in conv[system] or system == "dali":
            continue
        root = Path(conv[system]["path"])
        for f in sorted(root.rglob("*")):
            if f.is_file():
                obstore.put(store, f"{system}/{f.relative_to(root)}", f.read_bytes())
    return keys


def _remote_epoch(system, arm, conv, choice, items, keys, remote, work, cache_bytes=None,
                  epochs=1, shaper=None, batch=64) -> list[dict]:
    """`epochs` epochs of one system from S3, cold at the first: [{rate, bytes}]."""
    cache = work / "cache" / system
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    a = {"items": items, "out": conv[system].get("path"), "batch": batch, "workers": 2,
         "remote": dict(remote, prefix=system), "cache": str(cache), "cache_bytes": cache_bytes,
         "keys": keys.get(system)}
    out = []
    runs = "pcrfs-fused" if arm.startswith("fused-") else system
    if arm == "fused-source":      # the source JPEGs' objects (DALI's prefix), no mount
        a.update(root=conv["imagefolder"]["path"], objects=dict(remote, prefix="dali"))
    with _pcrfs_mount(arm, choice, remote, work, cache, cache_bytes) \
            if system == "pcrfs" and arm != "fused-source" else nullcontext() as m:
        if m is not None:
            a["root"] = str(m.mnt / _view(arm, choice))
        for _ in range(epochs):
            drop_page_cache()     # the FUSE files' pages too: only the bounded cache may hit
            b0 = shaper.sent()
            res = call("epoch", runs, a)
            out.append({"rate": res["remote_rate"], "steady": res["remote_steady_rate"],
                        "bytes": shaper.sent() - b0, "seconds": res["seconds"] + res["copy_s"],
                        # a whole copy first counts as waiting for the first batch
                        "first_batch_s": res["batch_s"][0] + res["copy_s"] if res["batch_s"] else None,
                        "cache_bytes_after": du(cache), "copy_s": res["copy_s"]})
    return out


def _pcrfs_mount(arm, choice, remote, work, cache, cache_bytes) -> Mounted:
    """The S3 dataset mounted with a cold disk tier: -o fetch=record, what docs/MOUNT.md
    gives a cold epoch from object storage (one GET per record and view, the tier holds
    the dataset); bounded and static for the 30% regime, image by image (a record is not
    the static policy's unit)."""
    opts = ["--cache-dir", str(cache), "--endpoint", remote["endpoint"]]
    if arm == "mix":
        opts += ["-o", f"mix={choice['share']},mix_fidelity={choice['fidelity']}"]
    if cache_bytes:
        opts += ["--cache-dir-size", str(cache_bytes), "--cache-size", str(cache_bytes),
                 "-o", "cache_policy=static"]
    else:
        opts += ["-o", "fetch=record"]
    return Mounted(f"s3://{BUCKET}/pcrfs", work / "mnt-peers-s3", *opts)


def s3_regimes(conv, choice, items, work, rounds, limits, batch=64, second=True,
               rows: list | None = None, save=lambda: None) -> list[dict]:
    """Rows appended to `rows` as each regime ends, then save() (a long run keeps what it
    measured if it is stopped)."""
    rows = [] if rows is None else rows
    todo = [a for a in ARMS_ALL if a[0] != "imagefolder"] + FUSED_S3_ARMS
    with s3(work) as (shaper, remote):
        keys = upload(conv, items, remote)
        if second:    # first: its single round is short, and a stopped run keeps it
            rows += second_epoch(conv, choice, items, keys, remote, shaper, work, batch=batch)
            save()
        for limit in limits:
            regime = f"s3_{limit}MBps"
            shaper.set(limit)
            picked = tune_remote(remote, work, len(items), limit) or choice
            fused = tune_remote(remote, work, len(items), limit, transform="fused")
            picked = dict(picked, view_bytes=choice.get("view_bytes"),
                          fused_fidelity=(fused or {}).get(
                              "fidelity", choice.get("fused_fidelity", picked["fidelity"])),
                          fused_view=(fused or {}).get("fused_view", choice.get("fused_view")))
            print(f"  {regime}: pcrfs tune picks q{picked['fidelity']}, share {picked['share']}"
                  f"; for FastImageFolder q{picked['fused_fidelity']}", flush=True)
            got: dict[tuple, list] = {}
            errors: dict[tuple, str] = {}
            for r in range(rounds):
                order = todo[r % len(todo):] + todo[: r % len(todo)]
                for system, arm in order:
                    if (system, arm) in errors or "error" in conv[system]:
                        continue
                    try:
                        got.setdefault((system, arm), []).extend(_remote_epoch(
                            system, arm, conv, picked, items, keys, remote, work, shaper=shaper,
                            batch=batch))
                    except (PeerError, subprocess.CalledProcessError) as e:
                        errors[(system, arm)] = str(e)
                print(f"  {regime} round {r + 1}/{rounds} done", flush=True)
            for system, arm in todo:
                g = got.get((system, arm), [])
                k = picked["fused_fidelity"] if arm == "fused-tuned" else picked["fidelity"]
                extra = {"fidelity": k, "share": picked["share"],
                         "ms_ssim": choice["ms_ssim"].get(f"q{k}")} \
                    if system == "pcrfs" and arm not in ("q10", "fused-q10", "fused-source") \
                    else {"stored_bytes": conv["imagefolder"]["stored_bytes"]} \
                    if arm == "fused-source" else {}
                extra.update(_link(system, arm, picked, choice, g, len(items), limit))
                rows.append(_row(system, arm, regime, [x["rate"] for x in g], conv,
                                 errors.get((system, arm)) or conv[system].get("error"),
                                 bytes_read=int(statistics.median(x["bytes"] for x in g)) if g else None,
                                 steady_images_per_s=round(statistics.median(
                                     x["steady"] for x in g), 1) if g else None,
                                 first_batch_s=round(statistics.median(
                                     x["first_batch_s"] or 0 for x in g), 3) if g else None,
                                 epoch_s=round(statistics.median(x["seconds"] for x in g), 3)
                                 if g else None,
                                 **extra))
            rows.append(_row("imagefolder", "files", regime, None, conv,
                             "plain files have no S3 reader (the pcrfs and peer rows are the comparison)"))
            save()
    return rows


MODEL_WITHIN = 0.25     # measured within 25% of W / E[s(x)] where the run is I/O-bound


def _link(system, arm, picked, choice, epochs, images, limit_mb) -> dict:
    """A pcrfs arm over S3: the view it read, the bytes per image that crossed the link
    (the shaper's count), and the paper's model X = W / E[s(x)] for that view (W the
    limit, E[s(x)] the view's mean file bytes); whether the run was I/O-bound (within
    MODEL_WITHIN of the model, or above it) or what bound it instead."""
    if system != "pcrfs":
        return {}
    view = "source" if arm == "fused-source" else _view(arm, picked)
    out = {"view": view}
    if epochs:
        out["bytes_per_image"] = round(statistics.median(x["bytes"] for x in epochs) / images)
    sizes = choice.get("view_bytes") or {}
    base = view[1:] if view[:1] == "b" else None       # b_k: no larger than q_k
    mean = (sizes.get(view) or (sizes.get(f"q{base}") if base else None)
            or (choice.get("source_bytes") if view == "source" else None))
    if mean and limit_mb:
        model = limit_mb * 1e6 / (mean / images)
        out["model_images_per_s"] = round(model, 1)
        rate = statistics.median(x["rate"] for x in epochs) if epochs else None
        if rate:
            out["model_ratio"] = round(rate / model, 3)
            out["bound"] = ("io" if rate >= (1 - MODEL_WITHIN) * model else
                            "cpu (decode, and the daemon's work on the same 2 cores)")
    return out


def tune_remote(remote: dict, work: Path, n: int, limit: float,
                transform: str = "imagenet") -> dict | None:
    """`pcrfs tune --min-fidelity 1` against the S3 mount under the regime's limit (its
    choice is not stored: each regime has its own).  The tuner's mount is told the link's
    rate (--bandwidth-limit, as a user who knows it would): the tuner takes its I/O budget
    from that option and does not measure the store, so under tc alone it saw no limit and
    chose raw files for every image (measured: share 1.0 at 5 MB/s)."""
    from pcrfs.liquid.tune import tune
    cache = work / "cache" / "tune"
    shutil.rmtree(cache, ignore_errors=True)
    try:
        with Mounted(f"s3://{BUCKET}/pcrfs", work / "mnt-peers-s3", "--cache-dir", str(cache),
                     "--endpoint", remote["endpoint"], "--bandwidth-limit", f"{limit}M") as m:
            # each S3 arm is one cold epoch from an empty cache: a b_k pays all its making
            c = tune(str(m.mnt), transform=transform, workers=2, sample=min(100, n),
                     store=False, log=lambda *_: None, min_fidelity=1, epochs=1)
        return {"fidelity": c["fidelity"], "share": c["share"], "ms_ssim": {},
                "view": tuned_view(c),
                "fused_view": f"b{c['seq']}" if c.get("seq") else f"q{c['fidelity']}"}
    except Exception as e:     # the local choice stands; the row says so
        print(f"  tune over S3 failed: {e}", flush=True)
        return None


BOUND_SLACK = 1.05    # a cache directory's own metadata and a file in flight


def fitting_choice(choice: dict, bound: int) -> dict | None:
    """The tuned arm of a bounded cache: the highest fidelity whose whole view fits the
    cache (the bytes `du -sb MNT/qk` gives), so that every image of the second epoch can
    hit; its MS-SSIM is reported beside it.  None without view sizes."""
    sizes = choice.get("view_bytes") or {}
    fits = [int(v[1:]) for v, b in sizes.items() if b <= bound]
    if not fits:
        return None
    k = max(fits)
    return dict(choice, fidelity=k, view=f"q{k}", view_bytes=sizes[f"q{k}"])


def second_epoch(conv, choice, items, keys, remote, shaper, work, share=0.3, limit=None,
                 batch=64) -> list[dict]:
    """Two epochs from S3 with each system's cache bounded at 30% of its stored bytes.
    pcrfs's tuned arm reads the highest fidelity whose view fits that bound: what the
    static cache then holds is every image the epoch asks for."""
    shaper.set(limit)
    rows = []
    for system, arm in [*ARMS_ALL, *FUSED_ARMS]:
        if system == "imagefolder":
            continue
        picked = choice
        if arm in ("tuned", "fused-tuned"):
            picked = fitting_choice(choice, int(share * conv[system]["stored_bytes"]))
            if picked is not None:       # FastImageFolder over the same fitting view
                picked = dict(picked, fused_fidelity=picked["fidelity"],
                              fused_view=f"q{picked['fidelity']}")
            if picked is None:
                rows.append(_row(system, arm, "second_epoch_30pct", None, conv,
                                 "no fidelity's view fits a cache of 30% of the dataset "
                                 "(or pcrfs info gave no view sizes)"))
                continue
        if "error" in conv[system]:
            rows.append(_row(system, arm, "second_epoch_30pct", None, conv, conv[system]["error"]))
            continue
        bound = int(share * conv[system]["stored_bytes_mix" if arm == "mix" else "stored_bytes"])
        # the source objects have no cache in between, as DALI's
        uncached = system == "dali" or arm == "fused-source"
        if system == "ffcv":
            rows.append(_row(system, arm, "second_epoch_30pct", None, conv,
                             "FFCV reads one whole local .beton (memory-mapped): a copy bounded "
                             "at 30% of it cannot be read; its second epoch is the whole local "
                             "copy (hit ratio 1.0 at 100% of the storage)"))
            continue
        try:
            e = _remote_epoch(system, arm, conv, picked, items, keys, remote, work,
                              cache_bytes=None if uncached else bound, epochs=2,
                              shaper=shaper, batch=batch)
            hit = 1 - e[1]["bytes"] / e[0]["bytes"] if e[0]["bytes"] else None
            kept = [x["cache_bytes_after"] for x in e]
            extra = {"fidelity": picked["fidelity"],
                     "ms_ssim": choice["ms_ssim"].get(f"q{picked['fidelity']}"),
                     "view_bytes": picked["view_bytes"]} if arm in ("tuned", "fused-tuned") else {}
            rows.append(_row(system, arm, "second_epoch_30pct", [e[1]["rate"]], conv,
                             bytes_read=e[1]["bytes"], hit_ratio=round(hit, 3),
                             cache_bytes=0 if uncached else bound,
                             # what the system kept on disk: its bound is its own to keep,
                             # and a hit ratio bought past it is not one at 30%
                             cache_bytes_after=kept,
                             within_bound=None if uncached else max(kept) <= BOUND_SLACK * bound,
                             note="DALI has no cache of its own" if system == "dali" else
                             "the source objects, fetched again: no cache in between"
                             if uncached else None,
                             **extra))
        except (PeerError, subprocess.CalledProcessError) as e:
            rows.append(_row(system, arm, "second_epoch_30pct", None, conv, str(e)))
        print(f"  second_epoch_30pct {system}/{arm}: {rows[-1]['hit_ratio']}", flush=True)
    return rows


def gpu_rows(conv, src: Path, images: int, work: Path, out: Path) -> list[dict]:
    """The gpu regime (bench/peers_gpu.py): measured here when CUDA is; else the rows of
    the last peers_gpu.json of the same source, measured on a GPU host (bench/devkit_run.sh
    peers_gpu), each with that host and time; else rows that say why there are none."""
    import torch
    if torch.cuda.is_available():
        from bench import peers_gpu
        return peers_gpu.run(src, work, out)["rows"]
    path = out / "peers_gpu.json"
    if path.exists():
        doc = json.loads(path.read_text())
        if (doc["result"]["images"], Path(doc["result"]["source"]).name) == (images, src.name):
            return [dict(r, measured=doc["time"], machine=doc["machine"])
                    for r in doc["result"]["rows"]]
    err = "no CUDA device on this machine (bench/peers_gpu.py measures the gpu regime where one is)"
    return [_row("pcrfs", "l3", "gpu", None, conv, err), _row("dali", "dali", "gpu", None, conv, err),
            _row("imagefolder", "nvjpeg", "gpu", None, conv, err)]


# -- the whole benchmark ---------------------------------------------------------------------
def run_all(work: Path, out: Path, images: int, quick: bool, source: str | None = None,
            regimes: list[str] | None = None, rounds: int = 5,
            limits: list[int] | None = None, which: str = "imagenet") -> dict:
    from bench.calibration import describe, ensure_set, result_name
    work = work / "peers"
    work.mkdir(parents=True, exist_ok=True)
    if source:
        src, about = Path(source), describe(Path(source), "source")
    else:
        src, about = ensure_set(work.parent, images, which)
    name = result_name("peers", which) if not source else "peers"
    items = items_of(src)
    regimes = regimes or ["cpu_local", "s3", "second_epoch_30pct", "gpu"]
    print(f"peers: {len(items)} images from {src}", flush=True)
    conv = convert_all(src, items, work)
    choice = pcrfs_choice(Path(conv["pcrfs"]["path"]), work / "mnt-peers", len(items))
    conv["pcrfs"]["stored_bytes_mix"] = choice["stored_bytes_with_raw_packs"]
    choice["source_bytes"] = conv["imagefolder"]["stored_bytes"]
    print(f"  pcrfs tune: q{choice['fidelity']} (MS-SSIM {choice['ms_ssim_tuned']}), raw share "
          f"{choice['share']}", flush=True)
    read_files([p for p, _ in items])
    rows = []
    profile = None

    def save():
        res = result(src, items, conv, choice, rows, rounds, profile, about)
        write_result(out, name, merge_previous(out / f"{name}.json", res))
    if "cpu_local" in regimes:
        rows += cpu_local(conv, choice, items, work, rounds)
        profile = rows[0].pop("profile", None)
        save()
    if "s3" in regimes or "second_epoch_30pct" in regimes:
        limits = (limits or ((50, 5) if quick else LIMITS_MB)) if "s3" in regimes else ()
        s3_regimes(conv, choice, items, work, rounds, limits,
                   second="second_epoch_30pct" in regimes, rows=rows, save=save)
    if "gpu" in regimes:
        rows += gpu_rows(conv, src, len(items), work, out)
    res = merge_previous(out / f"{name}.json",
                         result(src, items, conv, choice, rows, rounds, profile, about))
    write_result(out, name, res)
    plot(res, out / f"{name}.png")
    plot_sweep(res, out / f"{name}_sweep.png")
    return res


def result(src, items, conv, choice, rows, rounds, profile, about=None) -> dict:
    return {"systems": SYSTEMS, "images": len(items), "source": str(src), "set": about,
           "conversion": {s: {k: v for k, v in c.items() if k != "path"} for s, c in conv.items()},
           "pcrfs_choice": choice, "rows": rows, "rounds": rounds, "cpu_profile": profile,
           "pipeline": "RandomResizedCrop(224) + flip + normalize, float32 batches of 64, 2 "
                       "loader processes (FFCV, DALI: their own operations, 2 threads)",
           "targets": targets(rows, conv), "targets_82": targets_82(rows)}


def merge_previous(path: Path, res: dict) -> dict:
    """A run of some regimes (--regimes) keeps the rows of the others from the last
    peers.json of the same source, each marked with the time of the run that measured it."""
    ran = {r["regime"] for r in res["rows"]}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for r in res["rows"]:
        r.setdefault("measured", now)
    if not path.exists():
        return res
    old = json.loads(path.read_text())
    if (old["result"].get("source"), old["result"].get("images")) != (res["source"], res["images"]):
        return res
    kept = [dict(r, measured=r.get("measured", old.get("time"))) for r in old["result"]["rows"]
            if r["regime"] not in ran]
    if kept:
        res["rows"] = kept + res["rows"]
        if res.get("cpu_profile") is None:
            res["cpu_profile"] = old["result"].get("cpu_profile")
        # the local tuned and mix arms were measured with the old choice (`pcrfs tune`
        # may pick another fidelity on another run): it stays with their rows
        if "cpu_local" not in ran and any(r["regime"] == "cpu_local" for r in kept):
            res["pcrfs_choice_this_run"] = res["pcrfs_choice"]
            res["pcrfs_choice"] = old["result"]["pcrfs_choice"]
        res["targets"] = targets(res["rows"], res["conversion"])
        res["targets_82"] = targets_82(res["rows"])
    return res


def _best(rows, regime, systems) -> tuple[str, float] | None:
    c = [(r["system"], r["images_per_s"]) for r in rows
         if r["regime"] == regime and r["system"] in systems and r["images_per_s"]]
    return max(c, key=lambda x: x[1]) if c else None


def _rate(rows, regime, arm) -> float | None:
    return next((r["images_per_s"] for r in rows if r["regime"] == regime and r["system"] == "pcrfs"
                 and r["arm"] == arm), None)


def targets(rows, conv) -> dict:
    t = {}
    best = _best(rows, "s3_50MBps", PEERS)
    if best:
        tuned, q10 = _rate(rows, "s3_50MBps", "tuned"), _rate(rows, "s3_50MBps", "q10")
        t["s3_50MBps_tuned_over_best_peer"] = {"best": best[0], "ratio": tuned and round(tuned / best[1], 3),
                                               "target": 2.0}
        t["s3_50MBps_q10_over_best_peer"] = {"best": best[0], "ratio": q10 and round(q10 / best[1], 3),
                                             "target": 0.95}
    # issue 71: pcrfs's best arm (FastImageFolder's included) against the best peer
    for regime, goal in (("s3_50MBps", 2.0), ("s3_25MBps", 1.5), ("s3_100MBps", 1.5)):
        peer, ours = _best(rows, regime, PEERS), _best(rows, regime, {"pcrfs"})
        if peer and ours:
            arm = next(r["arm"] for r in rows if r["regime"] == regime and r["system"] == "pcrfs"
                       and r["images_per_s"] == ours[1])
            t[f"{regime}_best_pcrfs_over_best_peer"] = {
                "arm": arm, "best": peer[0], "ratio": round(ours[1] / peer[1], 3),
                "target": goal, "met": ours[1] / peer[1] >= goal}
    best = _best(rows, "cpu_local", TORCHVISION)
    mix = _rate(rows, "cpu_local", "mix")
    if best and mix:
        t["cpu_local_mix_over_best_torchvision_peer"] = {"best": best[0], "ratio": round(mix / best[1], 3),
                                                         "target": 1.0}
        for s in ("ffcv", "dali"):
            b = _best(rows, "cpu_local", {s})
            if b:
                t[f"cpu_local_mix_over_{s}"] = round(mix / b[1], 3)
    fused = _rate(rows, "cpu_local", "fused-tuned")
    for peer, goal in (("webdataset", 2.5), ("ffcv", 1.5)):     # issue 71's
        b = _best(rows, "cpu_local", {peer})
        if fused and b:
            t[f"cpu_local_fused_tuned_over_{peer}"] = {"ratio": round(fused / b[1], 3),
                                                       "target": goal, "met": fused / b[1] >= goal}
    second = [r for r in rows if r["regime"] == "second_epoch_30pct" and r["hit_ratio"] is not None]
    if second:
        ours = {r["arm"]: r["hit_ratio"] for r in second if r["system"] == "pcrfs"}
        peers = {r["system"]: r["hit_ratio"] for r in second if r["system"] != "pcrfs"}
        # a peer whose cache outgrew its bound did not hit at 30%: listed, not compared
        over = sorted(r["system"] for r in second if r.get("within_bound") is False)
        fair = [v for s, v in peers.items() if s not in over]
        t["second_epoch_30pct_hit_ratio"] = {
            "pcrfs": max(ours.values(), default=None), "pcrfs_arms": ours, "peers": peers,
            "peers_over_their_bound": over,
            "met": bool(ours) and (not fair or max(ours.values()) >= max(fair))}
    stored = {s: c["stored_bytes"] for s, c in conv.items() if c.get("stored_bytes")}
    t["stored_bytes"] = {"pcrfs": stored.get("pcrfs"), "smallest_peer": min(
        ((s, v) for s, v in stored.items() if s not in ("pcrfs", "imagefolder", "dali")),
        key=lambda x: x[1], default=None)}
    return t


def targets_82(rows) -> dict:
    """Issue 82's targets on the calibrated set: pcrfs's best arm reading a PCR view (not
    the sources) against the best peer over S3; its best arm against WebDataset and FFCV
    where CPU binds; unmodified ImageFolder over the view `pcrfs tune` picks against the
    plain files and WebDataset; each view's rate against the paper's model."""
    t: dict = {}

    def best_view_arm(regime):
        c = [r for r in rows if r["regime"] == regime and r["system"] == "pcrfs"
             and r["images_per_s"] and r.get("view") != "source"]
        return max(c, key=lambda r: r["images_per_s"]) if c else None
    for regime in ("s3_50MBps", "s3_100MBps"):
        ours, peer = best_view_arm(regime), _best(rows, regime, PEERS)
        if ours and peer:
            ratio = ours["images_per_s"] / peer[1]
            t[f"{regime}_best_pcr_view_over_best_peer"] = {
                "arm": ours["arm"], "view": ours.get("view"), "best": peer[0],
                "ratio": round(ratio, 3), "target": 4.0, "met": ratio >= 4.0}
    ours = _best(rows, "cpu_local", {"pcrfs"})
    for peer, goal in (("webdataset", 3.5), ("ffcv", 2.0)):
        b = _best(rows, "cpu_local", {peer})
        if ours and b:
            t[f"cpu_local_best_pcrfs_over_{peer}"] = {"ratio": round(ours[1] / b[1], 3),
                                                      "target": goal, "met": ours[1] / b[1] >= goal}
    for regime, against, goal in (("cpu_local", "imagefolder", 1.1), ("s3_50MBps", "webdataset", 2.0)):
        tuned = next((r for r in rows if r["regime"] == regime and r["system"] == "pcrfs"
                      and r["arm"] == "tuned" and r["images_per_s"]), None)
        b = _best(rows, regime, {against})
        if tuned and b:
            t[f"{regime}_imagefolder_tuned_over_{against}"] = {
                "view": tuned.get("view"), "ratio": round(tuned["images_per_s"] / b[1], 3),
                "target": goal, "met": tuned["images_per_s"] / b[1] >= goal}
    # the tuner's pick for ImageFolder against every other arm ImageFolder read in the
    # same regime: more than 5% slower is said
    for regime in sorted({r["regime"] for r in rows}):
        arms = {r["arm"]: r for r in rows if r["regime"] == regime and r["system"] == "pcrfs"
                and r["arm"] in ("q10", "tuned", "mix") and r["images_per_s"]}
        if "tuned" in arms and len(arms) > 1:
            other = max((r for a, r in arms.items() if a != "tuned"),
                        key=lambda r: r["images_per_s"])
            gap = 1 - arms["tuned"]["images_per_s"] / other["images_per_s"]
            t[f"{regime}_tuned_pick_against_other_arms"] = {
                "tuned_view": arms["tuned"].get("view"), "fastest_other": other["arm"],
                "slower_by": round(gap, 3), "slower_by_more_than_5pct": gap > 0.05}
    model = [r for r in rows if r.get("model_ratio") is not None
             and r["regime"] in ("s3_25MBps", "s3_50MBps", "s3_100MBps")]
    if model:
        io = [r for r in model if r["bound"] == "io"]
        t["model_within_25pct_where_io_bound"] = {
            "rows": {f"{r['regime']}/{r['arm']}/{r['view']}": {"ratio": r["model_ratio"],
                                                              "bound": r["bound"]} for r in model},
            "io_bound_rows": len(io),
            "met": all(abs(r["model_ratio"] - 1) <= MODEL_WITHIN for r in io)}
    return t


def plot_sweep(res: dict, path: Path) -> None:
    """Images/s against the S3 limit for every system, the paper's model for each pcrfs
    view drawn beside its arm; and predicted against measured, a panel of its own."""
    rows = [r for r in res["rows"] if r["regime"].startswith("s3_") and r["images_per_s"]]
    if not rows:
        return
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    mb = lambda r: float(r["regime"][3:-4])          # noqa: E731 - s3_50MBps -> 50
    arms = sorted({(r["system"], r["arm"]) for r in rows})
    for system, arm in arms:
        pts = sorted((mb(r), r["images_per_s"], r) for r in rows
                     if (r["system"], r["arm"]) == (system, arm))
        label = f"pcrfs/{arm} ({pts[-1][2].get('view')})" if system == "pcrfs" else system
        line, = a.plot([x for x, _, _ in pts], [y for _, y, _ in pts], "o-", label=label,
                       lw=2 if system == "pcrfs" else 1)
        model = [(x, r["model_images_per_s"]) for x, _, r in pts if r.get("model_images_per_s")]
        if model:
            a.plot(*zip(*model, strict=True), ls=":", color=line.get_color(), lw=1)
            b.scatter([m for _, m in model], [y for (_, y, r) in pts if r.get("model_images_per_s")],
                      color=line.get_color(), label=label, s=18)
    a.set_xscale("log")
    a.set_yscale("log")
    a.set_xlabel("S3 bandwidth limit (MB/s)")
    a.set_ylabel("images/s")
    a.set_title("images/s against bandwidth (dotted: W / E[s(x)] for the arm's view)")
    a.legend(fontsize=6)
    lim = max(max(r.get("model_images_per_s") or 0 for r in rows), 1)
    b.plot([1, lim], [1, lim], "k--", lw=0.8)
    b.plot([1, lim], [0.75, 0.75 * lim], "k:", lw=0.6)
    b.set_xscale("log")
    b.set_yscale("log")
    b.set_xlabel("predicted W / E[s(x)] (images/s)")
    b.set_ylabel("measured (images/s)")
    b.set_title("model against measured (dotted: -25%)")
    fig.suptitle(f"{res['images']} images ({(res.get('set') or {}).get('name', 'source')} set)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot(res: dict, path: Path) -> None:
    plt = pyplot()
    regimes = [g for g in dict.fromkeys(r["regime"] for r in res["rows"]) if g != "gpu"]
    fig, axes = plt.subplots(1, max(1, len(regimes)), figsize=(4.2 * max(1, len(regimes)), 4.5),
                             squeeze=False)
    for ax, regime in zip(axes[0], regimes, strict=False):
        rows = [r for r in res["rows"] if r["regime"] == regime]
        names = [f"{r['system']}/{r['arm']}" if r["system"] == "pcrfs" else r["system"] for r in rows]
        vals = [r["images_per_s"] or 0 for r in rows]
        colours = ["tab:blue" if r["system"] == "pcrfs" else "tab:gray" for r in rows]
        ax.barh(names, vals, color=colours)
        for i, r in enumerate(rows):
            if r["error"]:
                ax.text(0, i, " no result", va="center", fontsize=7, color="tab:red")
            elif r["hit_ratio"] is not None:
                ax.text(vals[i], i, f" hit {r['hit_ratio']:.2f}", va="center", fontsize=7)
        ax.set_title(regime)
        ax.set_xlabel("images/s")
        ax.invert_yaxis()
    fig.suptitle(f"pcrfs and its peers, {res['images']} images, median of {res['rounds']} rounds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary(res: dict) -> str:
    lines = [f"peers ({res['images']} images): conversion images/s and stored bytes"]
    for s, c in res["conversion"].items():
        rate = f"{c['images_per_s']:.1f}" if c.get("images_per_s") else "-"
        lines.append(f"  {s:20} {rate:>10} {c.get('stored_bytes') or c.get('error')}")
    for r in res["rows"]:
        lines.append(f"  {r['regime']:20} {r['system']:20} {r['arm']:10} "
                     f"{r['images_per_s'] or '-'!s:>8} hit {r['hit_ratio']!s:>5} {r['error'] or ''}")
    lines.append(f"  targets: {json.dumps(res['targets'])}")
    return "\n".join(lines)
