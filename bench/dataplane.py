"""The data plane (`pcrfs-bench --only dataplane`): cold files/s and daemon CPU per cold
file of a fresh mount, for q10, q5, raw and mix, by 1..16 reader processes (as many as
the machine has cores, and 2x that), with the lane's cold path in C (default) against
the Python path (-o lane_cold=no), and the source JPEGs on ext4 read by the same harness.
A second pass drops each file's page cache first, so the lane's image store serves it.
`oversubscribed`: cold q10 files/s with 2x and 4x as many decoding reader processes as
cores, under each lane thread priority (--oversubscribed-only runs just that).

Records are read into the page cache before each mount: "cold" is the daemon's view (a
file it has never served), not the disk's.  Readers are processes, each with its own
share of the files, so the harness is not the limit (its own ceiling is the ext4 row)."""
from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import random
import subprocess
import time
from pathlib import Path

from bench.common import PCRFS, REPO, Mounted, du, ensure_dataset, ensure_imagenet_like, pyplot, write_result

VIEWS = ("q10", "q5", "raw", "mix")
MIX = 0.5           # mix/'s raw share; every image's PPM is in a raw pack


def _read_share(args) -> int:
    files, drop = args
    n = 0
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            if drop:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            while os.read(fd, 1 << 20):
                pass
        finally:
            os.close(fd)
        n += 1
    return n


def read_all(files: list[str], readers: int, drop: bool = False) -> float:
    """Seconds for `readers` processes to read every file once (each a stride of them)."""
    shares = [(files[i::readers], drop) for i in range(readers)]
    with mp.get_context("fork").Pool(readers) as pool:
        pool.map(_read_share, [([], False)] * readers)      # processes up before timing
        t0 = time.perf_counter()
        pool.map(_read_share, shares, chunksize=1)
        return time.perf_counter() - t0


def cpu_seconds(pid: int) -> float:
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def files_under(root: Path) -> list[str]:
    return sorted(str(Path(d) / f) for d, _, fs in os.walk(root) for f in fs)


_WARMED: set[Path] = set()


def warm_records(ds: Path) -> None:
    """Records and raw packs into the page cache ("cold" is the daemon's view); once per
    dataset and process where memory holds every dataset (a 16-core host's 7 GB of raw
    packs would otherwise be read again before each of dozens of mounts)."""
    if ds in _WARMED:
        return
    if _fits_in_memory(ds):
        _WARMED.add(ds)
    for f in [*(ds / "records").iterdir(), *((ds / "raw").iterdir() if (ds / "raw").is_dir()
                                           else [])]:
        with open(f, "rb") as fh:
            while fh.read(1 << 22):
                pass


def _fits_in_memory(ds: Path) -> bool:
    return du(ds) * 4 < os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def wait_table(m: Mounted, names: bool, timeout: float = 120) -> None:
    """Until the lane has its segment table (and, if names, answers LOOKUPs by name)."""
    deadline = time.monotonic() + timeout
    while not (m.stats()["fast_lane"].get("segment_table_bytes", 0)
               and (not names or m.stats()["fast_lane"].get("lookup_names"))):
        if time.monotonic() > deadline:
            raise SystemExit("the lane's segment table never came")
        time.sleep(0.05)


ARMS = {"c": "", "c_listed": ",readdirplus=yes", "c_py_lookup": ",lane_lookup=no",
        "python": ",lane_cold=no"}


def measure(ds: Path, work: Path, view: str, readers: int, arm: str, extra: str = "") -> dict:
    """arm c: the default mount (LOOKUP, OPEN, READ, RELEASE of a q-view file in C);
    c_listed: listings carry attributes (-o readdirplus=yes), so the kernel sends no
    LOOKUP; c_py_lookup: -o lane_lookup=no, LOOKUPs answered by Python; python:
    -o lane_cold=no, cold reads through Python as before."""
    warm_records(ds)
    opts = ["-o", f"mix={MIX}" + ARMS[arm] + extra]
    with Mounted(ds, work / "mnt-dataplane", *opts) as m:
        if arm != "python":
            wait_table(m, names=arm != "c_py_lookup")
        files = files_under(m.mnt / view)
        c0 = cpu_seconds(m.pid)
        cold = read_all(files, readers)
        c1 = cpu_seconds(m.pid)
        second = read_all(files, readers, drop=True)
        c2 = cpu_seconds(m.pid)
        s = m.stats()["fast_lane"]
    n = len(files)
    return {"view": view, "arm": arm, "readers": readers, "files": n,
            "cold_files_per_s": round(n / cold), "daemon_cpu_us_per_cold_file":
            round(1e6 * (c1 - c0) / n, 1), "second_pass_files_per_s": round(n / second),
            "daemon_cpu_us_per_second_pass_file": round(1e6 * (c2 - c1) / n, 1),
            "cold_in_c": sum(c["files"] for c in s.get("cold", {}).values()),
            "lane_threads": s.get("threads")}


def disk_tier(ds: Path, work: Path, readers: int, rounds: int = 3) -> list[dict]:
    """A remote dataset's second epoch: the dataset in SeaweedFS, its q10 files once
    fetched into a disk tier, then read by fresh mounts on that tier, with the lane reading
    the tier in C (arm c) and with -o lane_cold=no (arm python), alternated; the tier's
    files in the page cache, as the records are above.  Median of `rounds`."""
    import statistics

    from bench.remote_reads import s3_server
    rows: dict[str, list[dict]] = {"c": [], "python": []}
    with s3_server(work / "seaweed-dataplane") as server:
        server.create_bucket("dataplane")
        url = "s3://dataplane/ds"
        subprocess.run([PCRFS, "push", str(ds), url, "--endpoint", server.endpoint, "-q"],
                       check=True)
        cache = work / "dataplane-disk-tier"
        subprocess.run(["rm", "-rf", str(cache)], check=True)
        opts = ["--cache-dir", str(cache), "--endpoint", server.endpoint]
        with Mounted(url, work / "mnt-dataplane", *opts) as m:
            read_all(files_under(m.mnt / "q10"), readers)      # epoch 1: fetched
        for _ in range(rounds):
            for arm, extra in (("c", []), ("python", ["-o", "lane_cold=no"])):
                warm_records_dir(cache)
                with Mounted(url, work / "mnt-dataplane", *opts, *extra) as m:
                    if arm == "c":
                        wait_table(m, names=True)
                    files = files_under(m.mnt / "q10")
                    before = m.stats()
                    c0 = cpu_seconds(m.pid)
                    t = read_all(files, readers)
                    c1 = cpu_seconds(m.pid)
                    st = m.stats()
                n = len(files)
                rows[arm].append({"files_per_s": n / t, "cpu_us": 1e6 * (c1 - c0) / n,
                                  "fetched": st["remote_bytes"] - before["remote_bytes"],
                                  "in_c": st["fast_lane"].get("disk_images_read", 0)})
    return [{"view": "q10", "arm": f"disk_tier_{arm}", "readers": readers,
             "files": len(files),
             "cold_files_per_s": round(statistics.median(r["files_per_s"] for r in rs)),
             "daemon_cpu_us_per_cold_file": round(statistics.median(r["cpu_us"] for r in rs), 1),
             "remote_bytes": max(r["fetched"] for r in rs),
             "cold_in_c": max(r["in_c"] for r in rs)} for arm, rs in rows.items()]


def warm_records_dir(d: Path) -> None:
    """Every file under d into the page cache."""
    for f in files_under(d):
        with open(f, "rb") as fh:
            while fh.read(1 << 22):
                pass


def run_all(work: Path, out: Path, images: int, quick: bool, views=VIEWS, arms=tuple(ARMS),
            counts=None, extras=("disk_tier", "priority", "oversubscribed", "profile", "stress"),
            stress_seconds: float = 30, extra: str = "") -> dict:
    """Every row, printed and saved (dataplane.partial.json) as it is measured, so a run
    cut short by a lease still leaves what it measured."""
    src = ensure_imagenet_like(work, images)
    ds = ensure_dataset(src, work / f"dataplane-{images}", "--views", "none")
    if not (ds / "raw.json").exists() and {"raw", "mix"} & set(views):
        subprocess.run([PCRFS, "materialize", str(ds), "raw", "--fraction", "1", "-q"],
                       check=True)
    cores = os.cpu_count() or 1
    counts = counts or [r for r in (1, 2, 4, 8, 16) if r <= max(2 * cores, 2)]
    if quick:
        counts = counts[:2]
    res = {"images": images, "cores": cores, "reader_counts": counts, "rows": [],
           "mount_options": extra}
    rows = res["rows"]

    def keep(row):
        rows.append(row)
        print(row, flush=True)
        (out / "dataplane.partial.json").write_text(json.dumps(res, indent=1) + "\n")
    plain = files_under(src)
    for readers in counts:
        for f in plain:                 # the page cache holds them, as it holds the records
            with open(f, "rb") as fh:
                fh.read()
        t = read_all(plain, readers)
        keep({"view": "plain", "arm": "ext4", "readers": readers, "files": len(plain),
              "cold_files_per_s": round(len(plain) / t)})
        for view in views:
            for arm in arms:
                keep(measure(ds, work, view, readers, arm, extra))
    if "stress" in extras:
        res["stress"] = stress(ds, work, stress_seconds, min(cores, 16), 2 * min(cores, 16))
        print(res["stress"], flush=True)
    if "disk_tier" in extras:
        rows += disk_tier(ds, work, counts[-1])
    res["priority"] = priority(ds, work, cores) if "priority" in extras else []
    if "oversubscribed" in extras:
        res["oversubscribed"] = oversubscribed(ds, work, cores)
    res["profile"] = profile(ds, work) if "profile" in extras else None
    res["profile_raw"] = profile(ds, work, "raw") if "profile" in extras else None
    res["targets"] = _targets(rows, counts)
    write_result(out, "dataplane", res)
    plot(res, out / "dataplane.png")
    return res


def _stress_share(args) -> tuple[int, list, list]:
    mnt, views, paths, want, seed, seconds = args
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    n, bad, errors = 0, [], []
    while time.monotonic() < deadline:
        v, p = rng.choice(views), rng.choice(paths)
        try:
            fd = os.open(os.path.join(mnt, v, p), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                chunks = []
                while chunk := os.read(fd, 1 << 20):
                    chunks.append(chunk)
            finally:
                os.close(fd)
        except OSError as e:
            errors.append(f"{v}/{p}: {e}")
            continue
        if hashlib.blake2b(b"".join(chunks)).digest() != want[(v, p)]:
            bad.append(f"{v}/{p}")
        n += 1
    return n, bad, errors


def stress(ds: Path, work: Path, seconds: float, lane_threads: int, readers: int,
           sample: int = 2000) -> dict:
    """`readers` processes over `lane_threads` lane threads for `seconds`, every read after
    its page cache is dropped and a store smaller than the data (evictions), so the lane's
    store, its cold path and Python all serve at once: every file against the digest of
    pcrfs's own library read of it (tests/test_dataplane.py's check, on every core)."""
    import pcrfs
    d = pcrfs.open_dataset(str(ds))
    views = ("q1", "q5", f"q{d.groups}", "dynamic")
    with Mounted(ds, work / "mnt-dataplane", "--cache-size", "64M",
                 "-o", f"lane_threads={lane_threads}") as m:
        paths = sorted(os.path.relpath(f, m.mnt / "q1") for f in files_under(m.mnt / "q1"))
        paths = random.Random(0).sample(paths, min(sample, len(paths)))
        want = {(v, p): hashlib.blake2b(d.read(p, f"q{d.groups}" if v == "dynamic" else v))
                .digest() for v in views for p in paths}
        with mp.get_context("fork").Pool(readers) as pool:
            got = pool.map(_stress_share, [(str(m.mnt), views, paths, want, i, seconds)
                                           for i in range(readers)])
        threads = m.stats()["fast_lane"].get("threads")
    reads = sum(g[0] for g in got)
    bad = [b for g in got for b in g[1]]
    errors = [e for g in got for e in g[2]]
    return {"seconds": seconds, "lane_threads": threads, "readers": readers,
            "reads": reads, "reads_per_s": round(reads / seconds), "mismatches": len(bad),
            "errors": len(errors), "examples": (bad + errors)[:5]}


def _spin(stop, out) -> None:
    n = 0
    while not stop.is_set():
        for _ in range(10000):
            pass
        n += 1
    out.put(n)


def priority(ds: Path, work: Path, cores: int) -> list[dict]:
    """Cold q10 reads by one reader while a busy loop runs on every core (DataLoader
    workers decoding), with no lane thread, the first, or every lane thread at
    SCHED_FIFO: files/s, and how much the busy loops got done (starvation)."""
    rows = []
    for prio in ("normal", "realtime", "all"):
        warm_records(ds)
        with Mounted(ds, work / "mnt-dataplane", "-o", f"lane_priority={prio}") as m:
            wait_table(m, names=True)
            files = files_under(m.mnt / "q10")
            stop, out = mp.Event(), mp.Queue()
            spinners = [mp.Process(target=_spin, args=(stop, out)) for _ in range(cores)]
            for p in spinners:
                p.start()
            time.sleep(0.5)         # the loops own the cores before the reader starts
            c0 = cpu_seconds(m.pid)
            t = read_all(files, 1)
            c1 = cpu_seconds(m.pid)
            stop.set()
            loops = sum(out.get() for _ in spinners)
            for p in spinners:
                p.join()
            realtime = m.stats()["fast_lane"]["realtime"]
        rows.append({"lane_priority": prio, "realtime_threads": realtime,
                     "cold_files_per_s": round(len(files) / t),
                     "daemon_cpu_us_per_cold_file": round(1e6 * (c1 - c0) / len(files), 1),
                     "busy_loop_rounds_per_s": round(loops / (t + 0.5))})
        print(rows[-1], flush=True)
    return rows


def _decode_share(files) -> int:
    """A training loader's worker: read each file through the mount, then decode it."""
    import io

    from PIL import Image
    for f in files:
        with open(f, "rb") as fh, Image.open(io.BytesIO(fh.read())) as im:
            im.convert("RGB")
    return len(files)


OVERSUBSCRIBED = (("normal", "lane_priority=normal"),
                  ("fifo_first", "lane_nice=0"),             # the default
                  ("fifo_first_nice_rest", "lane_nice=-10"))


def oversubscribed(ds: Path, work: Path, cores: int, factors=(2, 4)) -> list[dict]:
    """Cold q10 files/s when every core decodes: 2x and 4x as many reader processes as
    cores, each reading its share of the files and decoding each (Pillow), under the lane
    thread priorities: none raised, the first at SCHED_FIFO (the default), and that with
    the others at nice -10.  One pass per arm, in turn within each factor."""
    rows = []
    for factor in factors:
        readers = factor * cores
        for name, opts in OVERSUBSCRIBED:
            warm_records(ds)
            args = ("-o", opts) if opts else ()
            with Mounted(ds, work / "mnt-dataplane", *args) as m:
                wait_table(m, names=True)
                files = files_under(m.mnt / "q10")
                shares = [files[i::readers] for i in range(readers)]
                with mp.get_context("fork").Pool(readers) as pool:
                    pool.map(_decode_share, [[] for _ in range(readers)])
                    c0 = cpu_seconds(m.pid)
                    t0 = time.perf_counter()
                    n = sum(pool.map(_decode_share, shares, chunksize=1))
                    t = time.perf_counter() - t0
                    c1 = cpu_seconds(m.pid)
                lane = m.stats()["fast_lane"]
            rows.append({"readers": readers, "factor": factor, "lane_priority": name,
                         "realtime_threads": lane["realtime"], "niced_threads": lane.get("niced", 0),
                         "cold_files_per_s": round(n / t),
                         "daemon_cpu_us_per_cold_file": round(1e6 * (c1 - c0) / n, 1)})
            print(rows[-1], flush=True)
    return rows


def run_oversubscribed(work: Path, out: Path, images: int) -> dict:
    """Only the oversubscribed part, merged into the last dataplane.json (its other parts
    kept as they were, with the time each was measured)."""
    src = ensure_imagenet_like(work, images)
    ds = ensure_dataset(src, work / f"dataplane-{images}", "--views", "none")
    cores = os.cpu_count() or 1
    rows = oversubscribed(ds, work, cores)
    path = out / "dataplane.json"
    res = json.loads(path.read_text())["result"] if path.exists() else {"images": images,
                                                                       "cores": cores, "rows": []}
    res["oversubscribed"] = rows
    res["oversubscribed_measured"] = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                      "images": images, "cores": cores}
    write_result(out, "dataplane", res)
    return res


def profile(ds: Path, work: Path, view: str = "q10") -> dict | None:
    """Where a cold file's daemon CPU goes (the default mount, one reader): `perf`
    samples of the daemon, shares by binary and the top symbols.  None without perf."""
    import re
    import shutil
    import signal
    import tempfile
    if shutil.which("perf") is None:
        return None
    warm_records(ds)
    with tempfile.TemporaryDirectory() as tmp, \
            Mounted(ds, work / "mnt-dataplane", "-o", f"mix={MIX}") as m:
        wait_table(m, names=True)
        files = files_under(m.mnt / view)
        data = os.path.join(tmp, "perf.data")
        rec = subprocess.Popen(["perf", "record", "-F", "2999", "-p", str(m.pid), "-o", data],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)             # perf attached before the pass
        read_all(files, 1)
        rec.send_signal(signal.SIGINT)
        rec.wait()

        def report(sort: str, n: int) -> list[tuple[str, float]]:
            out = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort",
                                  sort, "--stdio", "-g", "none"],
                                 capture_output=True, text=True).stdout
            rows = [re.match(r"\s*([\d.]+)%\s+(.*\S)", line) for line in out.splitlines()
                    if not line.startswith("#")]
            return [(r[2], float(r[1])) for r in rows if r][:n]
        return {"files": len(files), "by_binary": dict(report("dso", 6)),
                "top_symbols": dict(report("dso,sym", 15))}


def _row(rows, view, arm, readers):
    return next((r for r in rows if r["view"] == view and r["arm"] == arm
                 and r["readers"] == readers), None)


def _targets(rows, counts) -> dict:
    """The issue's targets, from this run (a missed one says so)."""
    out = {}
    q1 = _row(rows, "q10", "c", 1)              # the default mount, LOOKUP in C
    raw1 = _row(rows, "raw", "c_listed", 1)     # raw/ names are Python's: listed, none
    listed = _row(rows, "q10", "c_listed", 1)
    if listed:
        out["q10_listed_daemon_cpu_us_per_cold_file"] = listed["daemon_cpu_us_per_cold_file"]
    if q1:
        out["q10_daemon_cpu_us_per_cold_file"] = {"value": q1["daemon_cpu_us_per_cold_file"],
                                                  "target": 60,
                                                  "met": q1["daemon_cpu_us_per_cold_file"] <= 60}
    if raw1:
        out["raw_daemon_cpu_us_per_cold_file"] = {"value": raw1["daemon_cpu_us_per_cold_file"],
                                                  "target": 80,
                                                  "met": raw1["daemon_cpu_us_per_cold_file"] <= 80}
    top = max(counts)
    if q1 and 8 in counts:
        r8 = _row(rows, "q10", "c", 8)
        ratio = r8["cold_files_per_s"] / _row(rows, "q10", "c", 1)["cold_files_per_s"]
        out["q10_8_readers_over_1"] = {"value": round(ratio, 2), "target": 5.0, "met": ratio >= 5}
    best = _row(rows, "q10", "c", top)
    if best:
        out["q10_cold_files_per_s_at_most_readers"] = {
            "readers": top, "value": best["cold_files_per_s"],
            "target_on_16_cores": 15000}
    for view in ("q10", "q5", "raw", "mix"):
        c, py = _row(rows, view, "c", top), _row(rows, view, "python", top)
        if c and py:
            out[f"{view}_c_over_python_at_{top}_readers"] = round(
                c["cold_files_per_s"] / py["cold_files_per_s"], 2)
    return out


def plot(res: dict, path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    counts = res["reader_counts"]
    for view in ("plain",) + VIEWS:
        for arm in ("ext4", "c", "c_listed", "c_py_lookup", "python"):
            pts = [_row(res["rows"], view, arm, r) for r in counts]
            if not all(pts):
                continue
            label = "ext4 JPEGs" if view == "plain" else f"{view} ({arm})"
            style = {"c": "-", "ext4": "-", "c_listed": ":", "c_py_lookup": "-.",
                     "python": "--"}[arm]
            axes[0].plot(counts, [p["cold_files_per_s"] for p in pts], style, marker="o",
                         label=label)
            if view != "plain":
                axes[1].plot(counts, [p["daemon_cpu_us_per_cold_file"] for p in pts], style,
                             marker="o", label=label)
    axes[0].set(xlabel="reader processes", ylabel="cold files/s", xscale="log", xticks=counts,
                xticklabels=counts, title=f"{res['images']} images, {res['cores']} cores")
    axes[1].set(xlabel="reader processes", ylabel="daemon CPU us per cold file", xscale="log",
                xticks=counts, xticklabels=counts, yscale="log")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def summary(res: dict) -> str:
    lines = [f"dataplane: {res['images']} images, {res['cores']} cores"]
    prof = res.get("profile")
    for r in res["rows"]:
        lines.append(f"  {r['view']:>5} {r['arm']:>6} x{r['readers']:<2} "
                     f"{r['cold_files_per_s']:>7} cold files/s"
                     + (f", {r['daemon_cpu_us_per_cold_file']} us daemon CPU/file, second pass "
                        f"{r['second_pass_files_per_s']} files/s" if "daemon_cpu_us_per_cold_file"
                        in r else ""))
    for r in res.get("priority", []):
        lines.append(f"  under busy loops, lane_priority={r['lane_priority']}: "
                     f"{r['cold_files_per_s']} cold q10 files/s, busy loops "
                     f"{r['busy_loop_rounds_per_s']} rounds/s")
    for view, p in (("q10", prof), ("raw", res.get("profile_raw"))):
        if p:
            lines.append(f"  where a cold {view} file's daemon CPU goes (perf): " + ", ".join(
                f"{k} {v:.0f}%" for k, v in p["by_binary"].items()))
    if st := res.get("stress"):
        lines.append(f"  stress: {st['readers']} readers over {st['lane_threads']} lane threads "
                     f"for {st['seconds']} s: {st['reads']} reads, {st['mismatches']} "
                     f"mismatches, {st['errors']} errors")
    lines.append(f"  targets: {res['targets']}")
    return "\n".join(lines)


def merge_sweep(runs: list[Path], out: Path) -> dict:
    """dataplane_lane_threads.{json,png}: runs of `--views q10 --arms c --mount-options
    lane_threads=N` (bench/devkit_run.sh lane_threads), one curve per run."""
    curves = []
    for d in runs:
        doc = json.loads((d / "dataplane.json").read_text())
        r = doc["result"]
        curves.append({"run": str(d), "mount_options": r.get("mount_options"),
                       "time": doc["time"], "machine": doc["machine"],
                       "rows": [x for x in r["rows"] if x["view"] == "q10"]})
    res = {"cores": curves[0]["machine"]["cpus"], "curves": curves}
    write_result(out, "dataplane_lane_threads", res)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for c in curves:
        pts = sorted((x["readers"], x["cold_files_per_s"]) for x in c["rows"])
        ax.plot(*zip(*pts, strict=True), marker="o",
                label=f"{c['mount_options'].strip(',') or 'default'}, "
                      f"{c['rows'][0]['lane_threads']} threads ({c['time'][11:16]} UTC)")
    ax.set(xlabel="reader processes", ylabel="cold q10 files/s", xscale="log",
           title=f"lane threads on {res['cores']} cores")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "dataplane_lane_threads.png", dpi=110)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--work", default=str(REPO / ".cache" / "bench"))
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    p.add_argument("--views", nargs="+", default=list(VIEWS), choices=VIEWS)
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--readers", nargs="+", type=int, help="reader counts (default 1..16)")
    p.add_argument("--extras", nargs="*",
                   default=["disk_tier", "priority", "oversubscribed", "profile", "stress"],
                   choices=["disk_tier", "priority", "oversubscribed", "profile", "stress"])
    p.add_argument("--stress-seconds", type=float, default=30)
    p.add_argument("--mount-options", default="", metavar="OPTS",
                   help="added to every measured mount's -o (e.g. lane_threads=4)")
    p.add_argument("--oversubscribed-only", action="store_true",
                   help="measure only the oversubscribed part, merged into dataplane.json")
    p.add_argument("--merge-sweep", nargs="+", type=Path, metavar="RUN",
                   help="only merge these runs' dataplane.json into dataplane_lane_threads")
    a = p.parse_args()
    out, work = Path(a.out), Path(a.work)
    out.mkdir(parents=True, exist_ok=True)
    if a.merge_sweep:
        merge_sweep(a.merge_sweep, out)
        return
    work.mkdir(parents=True, exist_ok=True)
    if a.oversubscribed_only:
        res = run_oversubscribed(work, out, a.images)
        print(json.dumps(res["oversubscribed"], indent=1))
        return
    print(summary(run_all(work, out, a.images, False, tuple(a.views), tuple(a.arms), a.readers,
                          tuple(a.extras), a.stress_seconds,
                          "," + a.mount_options if a.mount_options else "")))


if __name__ == "__main__":
    main()
