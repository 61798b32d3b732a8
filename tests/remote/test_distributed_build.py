"""Building on many machines (issue 42): record tasks on Dask (an embedded LocalCluster and
a running scheduler), straight from and into a real S3 server (SeaweedFS); `--part i/N`
then `--finalize`; a worker SIGKILLed mid-build.  Every result equals a local build of
the same tree with the same options, view by view."""
import json
import os
import re
import signal
import subprocess
import time

import pytest

import pcrfs
from pcrfs.errors import DatasetError
from pcrfs.storage.objclient import ObjectClient, RemoteOptions
from remote.conftest import BUCKET
from remote.util import files_of

from conftest import PCRFS, run_pcrfs

VOLATILE = ("uuid", "created", "xxh3", "files")


def upload_tree(src, url: str, endpoint: str) -> None:
    client = ObjectClient(url, RemoteOptions(endpoint=endpoint))
    for dirpath, _, names in os.walk(src):
        for n in names:
            path = os.path.join(dirpath, n)
            client.put_file(os.path.relpath(path, src), path)


def manifest_of(ds) -> dict:
    return {k: v for k, v in ds.manifest.items() if k not in VOLATILE}


def assert_same_dataset(got, want) -> None:
    """Same manifest (but its UUID and date), same build report lists, and every file of
    every view byte-identical; l3 sizes and checksums from the index identical too."""
    assert manifest_of(got) == manifest_of(want)
    n = 0
    for view in want.views:
        names = files_of(want, view)
        assert files_of(got, view) == names, view
        for rel in names:
            assert got.read(rel, view) == want.read(rel, view), (view, rel)
            n += 1
    assert n == len(want.views) * want.manifest["images"]
    for rel in files_of(want, want.views[0]):
        a, b = got.lookup(rel), want.lookup(rel)
        assert (a.l3_size, a.record, a.index) == (b.l3_size, b.record, b.index), rel
    # the l3 sidecars' (size, XXH3) items; their headers name each build's UUID
    for r in range(want.manifest["records"]):
        key = f"records/r{r:06d}.l3m"
        assert l3_items(got, key) == l3_items(want, key), key


def l3_items(ds, key: str) -> bytes:
    if ds.url:
        data = ObjectClient(ds.url, RemoteOptions(endpoint=os.environ["AWS_ENDPOINT_URL"])).get(key)
    else:
        data = open(os.path.join(ds.root, key), "rb").read()
    return data[32:-8]


def report_of(root: str, endpoint: str | None = None) -> dict:
    if endpoint:
        data = ObjectClient(root, RemoteOptions(endpoint=endpoint)).get("build-report.json")
    else:
        data = open(os.path.join(root, "build-report.json"), "rb").read()
    r = json.loads(data)
    return {k: r[k] for k in ("planned", "images", "skipped", "converted", "summary")}


@pytest.fixture
def s3_source(seaweed, small_src) -> str:
    """small_src (24 photo-like JPEGs in 3 classes) uploaded to SeaweedFS."""
    url = f"s3://{BUCKET}/sources/{small_src.parent.name}"
    with pytest.MonkeyPatch.context() as mp:
        for k, v in seaweed.env().items():
            mp.setenv(k, v)
        upload_tree(small_src, url, seaweed.endpoint)
    return url


def test_dask_local_cluster_builds_s3_to_s3_like_a_local_build(s3env, s3_source, small_src,
                                                               tmp_path):
    """`--engine dask --workers 2`: an embedded LocalCluster of two worker processes reads
    the sources from S3 and writes records, l3 sidecars and index parts straight to S3;
    the client merges the parts and writes the manifest last."""
    url = f"s3://{BUCKET}/dask-built"
    ref = tmp_path / "ref"
    run_pcrfs("build", small_src, ref, "--images-per-record", 4, "--shuffle-seed", 5, "-q")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = run_pcrfs("build", s3_source, url, "--images-per-record", 4, "--shuffle-seed", 5,
                    "--engine", "dask", "--workers", 2, "-q", "--tmp-dir", tmp)
    assert f"built {url}" in out.stdout and "GET" in out.stdout     # requests reported
    assert list(tmp.iterdir()) == []                 # the finalize temporary is gone
    keys = dict(ObjectClient(url, RemoteOptions(endpoint=s3env.endpoint)).list())
    # only the dataset: no parts, notes or build state left behind
    assert all(k.startswith(("records/", "index.lmdb/")) or k in ("manifest.json",
               "build-report.json") for k in keys), sorted(keys)
    got = pcrfs.open_dataset(url, remote=RemoteOptions(endpoint=s3env.endpoint))
    want = pcrfs.open_dataset(str(ref))
    assert_same_dataset(got, want)
    assert report_of(url, s3env.endpoint) == report_of(str(ref))


def test_a_dst_holding_another_dataset_is_refused(s3env, s3_corpus, s3_source, small_src,
                                                  tmp_path):
    before = ObjectClient(s3_corpus, RemoteOptions(endpoint=s3env.endpoint)).get("manifest.json")
    r = run_pcrfs("build", s3_source, s3_corpus, "-q", check=False)
    assert r.returncode == 2 and "holds another dataset" in r.stderr, r.stderr
    assert ObjectClient(s3_corpus, RemoteOptions(endpoint=s3env.endpoint)).get(
        "manifest.json") == before
    # a local DST too, for every engine and for parts
    ds = tmp_path / "ds"
    run_pcrfs("build", small_src, ds, "-q")
    for extra in ([], ["--part", "0/2"], ["--engine", "dask"]):
        r = run_pcrfs("build", s3_source, ds, *extra, "-q", check=False)
        assert r.returncode == 2 and "already" in r.stderr, (extra, r.stderr)


def test_parts_then_finalize_equal_the_local_build(edge_src, edge_ds, tmp_path):
    """Two `--part i/2` runs (a job array's tasks, no engine) and `--finalize`: the same
    dataset as one local build, the edge cases' skipped files reported the same way.  A
    finalize with a part missing refuses and names it."""
    dst = tmp_path / "ds"
    args = ("build", edge_src, dst, "--images-per-record", 7, "-q")
    out = run_pcrfs(*args, "--part", "1/2")
    assert "part 1/2" in out.stdout and "--finalize" in out.stdout
    r = run_pcrfs("build", "--finalize", dst, check=False)
    assert r.returncode == 2 and "--part 0/2" in r.stderr and "--part 1/2" not in r.stderr
    assert not dst.exists()
    with pytest.raises(DatasetError):
        pcrfs.open_dataset(str(tmp_path / "ds.partial"))
    run_pcrfs(*args, "--part", "0/2")
    run_pcrfs(*args, "--part", "0/2")        # a rerun part redoes nothing and harms nothing
    out = run_pcrfs("build", "--finalize", dst)
    assert f"built {dst}" in out.stdout
    assert_same_dataset(pcrfs.open_dataset(str(dst)), pcrfs.open_dataset(str(edge_ds)))
    assert report_of(str(dst)) == report_of(str(edge_ds))
    assert report_of(str(dst))["skipped"]              # the corrupt inputs, reported
    assert sorted(os.listdir(dst)) == sorted(os.listdir(edge_ds))
    # a part of a different plan is refused, not mixed in
    r = run_pcrfs("build", edge_src, tmp_path / "other", "--part", "0/3", "-q")
    r = run_pcrfs("build", edge_src, tmp_path / "other", "--part", "1/3",
                  "--images-per-record", 5, "-q", check=False)
    assert r.returncode == 2 and "changed" in r.stderr, r.stderr


def test_unreachable_scheduler_fails_at_once_naming_it(small_src, tmp_path):
    t = time.monotonic()
    r = run_pcrfs("build", small_src, tmp_path / "ds", "--engine", "dask=tcp://127.0.0.1:9",
                  "-q", check=False)
    assert r.returncode == 2 and "tcp://127.0.0.1:9" in r.stderr, r.stderr
    assert time.monotonic() - t < 30
    assert not (tmp_path / "ds").exists() and not (tmp_path / "ds.partial").exists()
    bad = run_pcrfs("build", small_src, tmp_path / "ds", "--engine", "spark", check=False)
    assert bad.returncode == 2 and "--engine" in bad.stderr


@pytest.fixture
def dask_cluster():
    from dask.distributed import Client, LocalCluster
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                           dashboard_address=None)
    client = Client(cluster)
    try:
        yield cluster, client
    finally:
        client.close()
        cluster.close()


KILL_IMAGES, KILL_IPR = 36, 2     # 18 records: long enough to be killed mid-build


@pytest.fixture(scope="module")
def kill_src(corpus_src, tmp_path_factory):
    """36 of the corpus photos (links), in their classes: a build of some seconds."""
    src = tmp_path_factory.mktemp("kill") / "src"
    for f in sorted(p for p in corpus_src.rglob("*") if p.is_file())[:KILL_IMAGES]:
        (src / f.parent.name).mkdir(parents=True, exist_ok=True)
        (src / f.parent.name / f.name).symlink_to(f)
    return src


@pytest.fixture(scope="module")
def kill_ref(kill_src):
    """kill_src built locally, 2 images per record, shuffled: what every build must equal."""
    ref = kill_src.parent / "ref"
    run_pcrfs("build", kill_src, ref, "--images-per-record", KILL_IPR, "--shuffle-seed", 3, "-q")
    return ref


def records_written(where) -> int:
    if isinstance(where, str):
        return sum(k.endswith(".pcr") for k, _ in ObjectClient(
            where, RemoteOptions(endpoint=os.environ["AWS_ENDPOINT_URL"])).list("records"))
    return len(list(where.glob("*.pcr"))) if where.is_dir() else 0


def test_a_worker_sigkilled_mid_build_is_redone_and_the_output_is_identical(
        dask_cluster, kill_src, kill_ref, tmp_path):
    """A running scheduler (`--engine dask=tcp://...`): one worker process is SIGKILLed
    while records are being written.  The scheduler hands its tasks to the other worker
    (and the nanny's new one); no manifest exists until the end, and the dataset equals
    a local build of the same tree."""
    cluster, client = dask_cluster
    ref = kill_ref
    dst = tmp_path / "ds"
    proc = subprocess.Popen([PCRFS, "build", str(kill_src), str(dst), "--images-per-record",
                             str(KILL_IPR), "--shuffle-seed", "3", "-q", "--engine",
                             f"dask={cluster.scheduler_address}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    records = tmp_path / "ds.partial" / "records"
    deadline = time.monotonic() + 300
    while records_written(records) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    pids = client.run(os.getpid)
    victim = sorted(pids.values())[0]
    os.kill(victim, signal.SIGKILL)
    killed_at = len(list(records.glob("*.pcr")))
    assert proc.poll() is None, "the build ended before the kill: make it longer"
    assert not (tmp_path / "ds.partial" / "manifest.json").exists() and not dst.exists()
    assert killed_at < KILL_IMAGES // KILL_IPR
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert victim not in client.run(os.getpid).values()     # the worker really died
    assert_same_dataset(pcrfs.open_dataset(str(dst)), pcrfs.open_dataset(str(ref)))
    assert sorted(os.listdir(dst / "records")) == sorted(os.listdir(ref / "records"))


def test_materialize_and_push_run_on_the_same_engines(s3env, small_src, tmp_path):
    """`materialize --engine dask` writes the same raw packs as the local engine, and
    `push --engine dask` uploads every file byte for byte, manifest last."""
    import shutil
    ds = tmp_path / "ds"
    run_pcrfs("build", small_src, ds, "--images-per-record", 5, "-q")
    twin = tmp_path / "twin"
    shutil.copytree(ds, twin)
    run_pcrfs("materialize", ds, "raw", "--fraction", "0.6", "-q")
    run_pcrfs("materialize", twin, "raw", "--fraction", "0.6", "-q", "--engine", "dask",
              "--jobs", 2)
    packs = sorted(os.listdir(ds / "raw"))
    assert packs and sorted(os.listdir(twin / "raw")) == packs
    for name in packs:
        assert (ds / "raw" / name).read_bytes() == (twin / "raw" / name).read_bytes(), name
    url = f"s3://{BUCKET}/dask-pushed"
    out = run_pcrfs("push", twin, url, "-q", "--engine", "dask", "--jobs", 2)
    assert "manifest last" in out.stdout
    client = ObjectClient(url, RemoteOptions(endpoint=s3env.endpoint))
    keys = dict(client.list())
    local = {os.path.relpath(os.path.join(d, n), twin): os.path.join(d, n)
             for d, _, names in os.walk(twin) for n in names}
    for key, path in local.items():
        if key in keys:
            assert client.get(key) == open(path, "rb").read(), key
    assert "manifest.json" in keys and any(k.startswith("raw/") for k in keys)
    got = pcrfs.open_dataset(url, remote=RemoteOptions(endpoint=s3env.endpoint))
    assert got.manifest["uuid"] == pcrfs.open_dataset(str(twin)).manifest["uuid"]


def test_a_remote_build_whose_client_dies_resumes_to_the_same_dataset(s3env, kill_src,
                                                                      kill_ref):
    """The client SIGKILLed mid-build (local tree -> s3): the prefix is no dataset (no manifest);
    the same command refuses to start over it; with --resume the finished records are
    kept and the dataset equals the local build."""
    url = f"s3://{BUCKET}/resumed"
    args = [PCRFS, "build", str(kill_src), url, "--images-per-record", str(KILL_IPR),
            "--shuffle-seed", "3", "-q"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while records_written(url) < 3:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    client = ObjectClient(url, RemoteOptions(endpoint=s3env.endpoint))
    assert client.head("manifest.json") is None
    with pytest.raises(DatasetError):
        pcrfs.open_dataset(url, remote=RemoteOptions(endpoint=s3env.endpoint))
    r = run_pcrfs(*args[1:], check=False)
    assert r.returncode == 2 and "--resume" in r.stderr, r.stderr
    kept = records_written(url)
    out = run_pcrfs(*args[1:], "--resume")
    assert f"built {url}" in out.stdout
    puts = int(re.search(r"(\d+) PUT", out.stdout).group(1))
    # the kept records were not written again
    assert puts <= 4 * (KILL_IMAGES // KILL_IPR - kept) + 3 + 4
    got = pcrfs.open_dataset(url, remote=RemoteOptions(endpoint=s3env.endpoint))
    assert_same_dataset(got, pcrfs.open_dataset(str(kill_ref)))

