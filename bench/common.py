"""Shared benchmark plumbing: process-tree RSS, timing, mounts, result files."""
from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
# the venv's entry point; on a host set up by a kit (no venv), the one on PATH
PCRFS = str(VENV_BIN / "pcrfs") if (VENV_BIN / "pcrfs").exists() else (shutil.which("pcrfs")
                                                                         or "pcrfs")


def tree_rss(pid: int) -> int:
    """Resident bytes of pid and all its descendants."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def timed(cmd: list[str], **kw) -> tuple[float, int]:
    """Wall seconds and peak RSS of the whole process tree (sampled every 20 ms)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)
    peak = [0]

    def sample():
        while proc.poll() is None:
            peak[0] = max(peak[0], tree_rss(proc.pid))
            time.sleep(0.02)
    th = threading.Thread(target=sample, daemon=True)
    th.start()
    _, err = proc.communicate()
    th.join()
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed: {err.decode()[-2000:]}")
    return time.perf_counter() - t0, peak[0]


def du(path) -> int:
    """Bytes of every file under path (what a system stores), without directory entries."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def pcrfs(*args) -> str:
    return subprocess.run([PCRFS, *map(str, args)], check=True, capture_output=True,
                          text=True).stdout


class Mounted:
    def __init__(self, dst, mnt, *args):
        self.dst, self.mnt, self.args = dst, Path(mnt), args

    def __enter__(self):
        self.mnt.mkdir(parents=True, exist_ok=True)
        pcrfs("mount", self.dst, self.mnt, *self.args)
        self.pid = self.stats()["pid"]
        return self

    def stats(self) -> dict:
        return json.loads((self.mnt / ".pcrfs" / "stats.json").read_text())

    def rss(self) -> int:
        return tree_rss(self.pid)

    def __exit__(self, *exc):
        subprocess.run([PCRFS, "umount", str(self.mnt)], capture_output=True)


def median(xs):
    return statistics.median(xs)


def best_seconds(fn, repeat: int) -> float:
    """The fastest of `repeat` timed calls of fn (the least disturbed by other load)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def ensure_imagenet_like(work: Path, images: int) -> Path:
    src = work / f"imagenet-like-{images}"
    if not src.exists():
        tmp = work / f"imagenet-like-{images}.tmp"
        subprocess.run([sys.executable, str(REPO / "tools" / "make_imagefolder.py"),
                        str(REPO / ".cache" / "corpus"), str(tmp), "--mode", "crops",
                        "--count", str(images), "--classes", "20",
                        "--workers", str(os.cpu_count() or 1)], check=True)
        tmp.rename(src)
    return src


def ensure_dataset(src: Path, dst: Path, *args) -> Path:
    manifest = dst / "manifest.json"
    # rebuild datasets written before format views existed
    if not manifest.exists() or "format_views" not in json.loads(manifest.read_text()):
        subprocess.run(["rm", "-rf", str(dst), str(dst) + ".partial"], check=True)
        pcrfs("build", src, dst, "-q", *args)
    return dst


_began = time.monotonic()


def begin() -> None:
    """A benchmark starts: its JSON's wall_s counts from here (bench/run.py calls it)."""
    global _began
    _began = time.monotonic()


def command() -> str:
    """This process's command line as a user types it (pcrfs-bench, python -m bench.X)."""
    prog = Path(sys.argv[0])
    if prog.name != "pcrfs-bench" and prog.suffix == ".py" and prog.parent.name == "bench":
        prog = Path(f"python -m bench.{prog.stem}")
    return " ".join([prog.name if prog.name == "pcrfs-bench" else str(prog), *sys.argv[1:]])


def stamp() -> dict:
    """Where, by what and when something is measured now: a result's, or a part's that is
    merged into an older result (bench/perf_doc.py shows each)."""
    return {"machine": {"node": platform.node(), "cpus": os.cpu_count(),
                        "python": platform.python_version(), "platform": platform.platform()},
            "command": command(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def write_result(out: Path, name: str, result: dict) -> None:
    doc = {"benchmark": name, **stamp(),
           "wall_s": round(time.monotonic() - _began, 1),      # what the benchmark took
           "result": result}
    (out / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")


def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


@contextmanager
def environment(env: dict):
    """`env` set in os.environ (as pcrfs subprocesses read credentials), restored after."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
