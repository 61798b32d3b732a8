import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from edgecases import edge_cases  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / ".cache" / "corpus"
PCRFS = shutil.which("pcrfs", path=os.path.dirname(sys.executable)) or "pcrfs"


def wait_until(pred, timeout: float, what: str, interval: float = 0.02):
    """Poll pred() until it is truthy (its value is returned) or fail after timeout."""
    import time
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def raises_errno(fn, code: int) -> bool:
    """Whether fn() fails with OSError `code` now (for wait_until)."""
    try:
        fn()
    except OSError as e:
        return e.errno == code
    return False


def concurrent_progress(call) -> float:
    """How much a pure-Python counter thread advances while call() runs, relative to a
    baseline measured alike with the main thread merely sleeping for as long: near 1 when
    call() releases the GIL (2 cores), near 0 when it holds it."""
    import threading
    import time
    ticks, done = [0], threading.Event()

    def count():
        while not done.is_set():
            ticks[0] += 1
    th = threading.Thread(target=count)
    th.start()
    try:
        wait_until(lambda: ticks[0] > 0, 5, "the counter thread to run")
        t0, start = time.perf_counter(), ticks[0]
        call()
        took, during = time.perf_counter() - t0, ticks[0] - start
        start = ticks[0]
        time.sleep(took)
        baseline = ticks[0] - start
    finally:
        done.set()
        th.join()
    return during / max(baseline, 1)


def run_pcrfs(*args, check=True, **kw) -> subprocess.CompletedProcess:
    """The real console script, as a user runs it."""
    p = subprocess.run([PCRFS, *map(str, args)], capture_output=True, text=True, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"pcrfs {' '.join(map(str, args))} failed ({p.returncode}):\n"
                             f"{p.stdout}\n{p.stderr}")
    return p


@pytest.fixture(scope="session", autouse=True)
def _private_cache_home(tmp_path_factory):
    """Mounts default to $XDG_CACHE_HOME/pcrfs for transcodes: keep tests out of ~/.cache."""
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))


@pytest.fixture(scope="session")
def corpus() -> Path:
    subprocess.run([str(REPO / "tools" / "fetch_corpus.sh"), str(CORPUS)], check=True,
                   capture_output=True)
    files = sorted(p for p in CORPUS.iterdir() if p.suffix in (".jpg", ".png"))
    assert len([p for p in files if p.suffix == ".jpg"]) >= 50, "corpus fetch failed"
    return CORPUS


@pytest.fixture(scope="session")
def corpus_src(corpus, tmp_path_factory) -> Path:
    """Every corpus photo (JPEG and PNG) in an ImageFolder tree of 5 classes."""
    src = tmp_path_factory.mktemp("corpus") / "src"
    for i, f in enumerate(sorted(p for p in corpus.iterdir() if p.suffix in (".jpg", ".png"))):
        d = src / f"class_{i % 5}"
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, d / f.name)
    return src


@pytest.fixture(scope="session")
def corpus_ds(corpus_src) -> Path:
    return _built_beside(corpus_src)


def _built_beside(src: Path) -> Path:
    """SRC's dataset at SRC/../ds, 16 images per record."""
    dst = src.parent / "ds"
    run_pcrfs("build", src, dst, "--images-per-record", 16, "-q")
    return dst


@pytest.fixture(scope="session")
def corpus_part_src(corpus_src, tmp_path_factory) -> Path:
    """Two of corpus_src's classes (about 40 photos, JPEG and PNG): for tests that build
    a tree themselves (into a store, or killed and resumed) and need no more."""
    src = tmp_path_factory.mktemp("corpus-part") / "src"
    for d in sorted(corpus_src.iterdir())[:2]:
        shutil.copytree(d, src / d.name)
    assert {f.suffix for f in src.rglob("*.*")} == {".jpg", ".png"}
    return src


@pytest.fixture(scope="session")
def corpus_part_ds(corpus_part_src) -> Path:
    return _built_beside(corpus_part_src)


@pytest.fixture(scope="session")
def edge_src(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("edge") / "src"
    for rel, (data, _) in edge_cases().items():
        p = os.path.join(os.fsencode(src), rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
    (src / "stray_top_level.jpg").write_bytes(edge_cases()[b"jpeg/baseline_420.jpg"][0])
    return src


@pytest.fixture(scope="session")
def edge_ds(edge_src) -> Path:
    dst = edge_src.parent / "ds"
    run_pcrfs("build", edge_src, dst, "--images-per-record", 7, "-q")
    return dst


@pytest.fixture
def small_src(tmp_path) -> Path:
    """A quick 3-class tree of 24 generated photo-like JPEGs, for format/crash tests."""
    from PIL import Image

    from edgecases import photo_like
    src = tmp_path / "src"
    for i in range(24):
        d = src / f"c{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(photo_like(96 + i, 64 + i, i)).save(d / f"im{i:02d}.jpg", quality=90)
    return src


def tiny_records_src(root: Path, n: int = 1300) -> Path:
    """n tiny distinct JPEGs in 10 classes: with --images-per-record 1, ImageNet's record
    count (1,252) in seconds."""
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(1300)
    src = root / "src"
    for i in range(n):
        d = src / f"c{i % 10}"
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (16, 24, 3), dtype=np.uint8)).save(
            d / f"im{i:04d}.jpg", quality=80)
    return src


@pytest.fixture(scope="session")
def many_records_ds(tmp_path_factory) -> Path:
    """1,300 records of one image each (more than ImageNet's 1,252)."""
    root = tmp_path_factory.mktemp("many-records")
    dst = root / "ds"
    run_pcrfs("build", tiny_records_src(root), dst, "--images-per-record", 1, "-q")
    return dst


def read_everything_under_limit(mnt: Path, ds_path, views, pid: int, nofile: int,
                                threads: int = 4) -> dict:
    """Every file of `views` read through the mount in random order by `threads` threads,
    compared with the dataset API; the daemon must never hold more than `nofile` fds."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    from pcrfs.dataset import open_dataset
    limits = Path(f"/proc/{pid}/limits").read_text()
    line = next(ln for ln in limits.splitlines() if ln.startswith("Max open files"))
    assert line.split()[3:5] == [str(nofile), str(nofile)], line
    jobs = [(v, os.path.relpath(os.path.join(d, f), mnt / v))
            for v in views for d, _, fs in os.walk(mnt / v) for f in fs]
    random.Random(17).shuffle(jobs)
    ref = open_dataset(str(ds_path))
    errors, mismatches, peak = [], [], [0]

    def work(job):
        view, rel = job
        try:
            got = (mnt / view / rel).read_bytes()
        except OSError as e:
            errors.append((view, rel, e))
            return
        if got != ref.read(rel, view):
            mismatches.append((view, rel))
        peak[0] = max(peak[0], len(os.listdir(f"/proc/{pid}/fd")))
    try:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(work, jobs))
    finally:
        ref.close()
    assert not errors, f"{len(errors)} of {len(jobs)} reads failed, e.g. {errors[:3]}"
    assert not mismatches, f"{len(mismatches)} mismatches, e.g. {mismatches[:3]}"
    assert peak[0] <= nofile
    return {"files": len(jobs), "peak_fds": peak[0]}


@pytest.fixture(scope="session")
def crops_src(corpus, tmp_path_factory) -> Path:
    """ImageNet-like: 240 crops of the real photos, 500x375, q90 4:2:0, in 8 classes."""
    src = tmp_path_factory.mktemp("crops") / "src"
    subprocess.run([sys.executable, str(REPO / "tools" / "make_imagefolder.py"), str(corpus),
                    str(src), "--mode", "crops", "--count", "240", "--classes", "8"],
                   check=True, capture_output=True)
    return src


@pytest.fixture(scope="session")
def crops_ds(crops_src) -> Path:
    dst = crops_src.parent / "ds"
    run_pcrfs("build", crops_src, dst, "--images-per-record", 64, "-q")
    return dst


class Mount:
    """A real `pcrfs mount` daemon; always unmounted (or killed and cleaned) afterwards."""

    def __init__(self, dst, mnt, *args, nofile: int | None = None):
        remote = str(dst).startswith(("s3://", "gs://", "az://", "http://", "https://"))
        self.dst = str(dst) if remote else Path(dst)
        self.mnt, self.args = Path(mnt), [str(a) for a in args]
        self.nofile = nofile      # RLIMIT_NOFILE (soft = hard) the daemon starts under

    def __enter__(self):
        self.mnt.mkdir(parents=True, exist_ok=True)
        kw = {}
        if self.nofile:
            import resource
            n = self.nofile
            kw["preexec_fn"] = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
        run_pcrfs("mount", self.dst, self.mnt, *self.args, **kw)
        s = self.stats()
        self.pid, self.supervisor = s["pid"], (s.get("supervisor") or {}).get("pid")
        return self

    def stats(self) -> dict:
        """stats.json, in 1 MiB read()s until EOF: two READs every time (tests count
        READs).  The mount pads each rendering to the steady size LOOKUP gave, so
        read_text() would mostly cost two as well; reading to EOF also covers the rare
        rendering that outgrows that size (which then grows it)."""
        import json
        fd = os.open(self.mnt / ".pcrfs" / "stats.json", os.O_RDONLY)
        try:
            parts = []
            while part := os.read(fd, 1 << 20):
                parts.append(part)
        finally:
            os.close(fd)
        return json.loads(b"".join(parts))

    def kernel_options(self) -> list[str]:
        """The mount's options as the kernel shows them in /proc/self/mounts."""
        return next(ln.split()[3].split(",") for ln in open("/proc/self/mounts")
                    if ln.split()[1] == str(self.mnt))

    def alive(self, pid: int | None = None) -> bool:
        pid = pid or self.pid
        try:  # a zombie (exited, not yet reaped by init) counts as gone
            return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
        except (FileNotFoundError, ProcessLookupError):
            return False

    def __exit__(self, *exc):
        import time
        r = run_pcrfs("umount", self.mnt, check=False)
        if r.returncode != 0:
            subprocess.run(["fusermount3", "-uz", str(self.mnt)], capture_output=True)
        pids = [p for p in (self.supervisor, self.pid) if p]
        for _ in range(100):  # the daemon (and its supervisor) exit once unmounted
            if not any(self.alive(p) for p in pids):
                return
            time.sleep(0.05)
        for p in pids:
            if self.alive(p):
                os.kill(p, 9)


@pytest.fixture
def interpreted(monkeypatch):
    """pcrfs's Triton kernels built for Triton's interpreter (CPU tensors), for this test
    only: CI has no GPU."""
    from pcrfs.torch import jpeg_triton, l3_triton, pixels_triton, resize_triton
    kernels = (l3_triton.kernel, jpeg_triton.kernel, pixels_triton.kernels, pixels_triton.smoothing,
               resize_triton.kernel)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for k in kernels:
        k.cache_clear()
    yield
    for k in kernels:
        k.cache_clear()


@pytest.fixture
def mount(tmp_path):
    """mount(dst, *args) -> Mount context, unmounted at teardown."""
    mounts = []

    def make(dst, *args, mnt=None, nofile=None):
        m = Mount(dst, mnt or tmp_path / f"mnt{len(mounts)}", *args, nofile=nofile).__enter__()
        mounts.append(m)
        return m
    yield make
    for m in reversed(mounts):
        m.__exit__(None, None, None)


# -- tiers: `make test-fast` runs what neither mounts nor starts a server -----------------
# Markers come from a test's fixture closure (pytest's own list, fixtures of fixtures
# included) and, for what a test starts itself, from its body; tests/mountwatch.py then
# fails any test that mounted without the `mounts` marker, so no mount slips through.
MOUNT_FIXTURES = {"mount", "supervised", "small_mount", "cluster", "plugin", "small_disk"}
SERVER_FIXTURES = {"seaweed", "azurite", "gcs", "nginx", "dask_cluster", "peers"}
SERVER_CLASSES = ("SeaweedFS(", "Azurite(", "GcsEmulator(", "Nginx(", "Memcached(",
                  "Prometheus(", "FlakyProxy(", "LocalCluster(")
MOUNT_CALLS = ('"mount"', "Mounted(", "Mount(", "supervised(")
# fixtures that build the whole corpus, and tests of more than ~10 s without them (a
# million index entries, the Triton interpreter, DDP processes, a bench through a mount,
# building the wheels and installing them into a new venv)
HEAVY_FIXTURES = {"corpus_ds", "corpus_ds_views", "wheel_venv"}
HEAVY_TESTS = ("test_unique_in_every_view_of_a_million_entries", "test_corpus_",
               "test_kernel_equals_the_c_decoder", "test_kernel_rejects_what_the_c_decoder",
               "test_ddp_training_is_the_same", "test_torchrun_", "test_prepare_through_the_mount",
               "test_killed_build_never_opens")


def pytest_collection_modifyitems(config, items):
    """Markers from what a test uses: its fixtures (the whole closure) and the servers or
    mounts its own body starts.  make test-fast excludes `mounts`, `servers` and `heavy`."""
    import inspect
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        try:
            body = inspect.getsource(item.function)
        except (AttributeError, OSError, TypeError):
            body = ""
        if names & MOUNT_FIXTURES or any(c in body for c in MOUNT_CALLS):
            item.add_marker(pytest.mark.mounts)
        if names & SERVER_FIXTURES or any(c in body for c in SERVER_CLASSES):
            item.add_marker(pytest.mark.servers)
        if names & HEAVY_FIXTURES or item.name.startswith(HEAVY_TESTS):
            item.add_marker(pytest.mark.heavy)


def pytest_sessionstart(session):
    from mountwatch import MountWatch
    session.config.mountwatch = MountWatch(str(session.config._tmp_path_factory.getbasetemp()))


def pytest_sessionfinish(session):
    watch = getattr(session.config, "mountwatch", None)
    if watch is not None:
        watch.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    item.config.mountwatch.take()          # what earlier tests' teardowns left is theirs
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    result = yield
    mounted = item.config.mountwatch.take()
    if mounted and item.get_closest_marker("mounts") is None:
        pytest.fail(f"{item.nodeid} mounted {mounted} without the `mounts` marker: add the "
                    "fixture that mounts to MOUNT_FIXTURES (tests/conftest.py)", pytrace=False)
    return result
