"""Resource limits at production scale: more records than open-file descriptors."""
from conftest import read_everything_under_limit, run_pcrfs


def test_more_records_than_descriptors(many_records_ds, mount):
    """1,300 records under RLIMIT_NOFILE 64: every q1, qG and l3 file reads back right."""
    m = mount(many_records_ds, nofile=64)
    views = ["q1", f"q{len([v for v in (m.mnt).iterdir() if v.name.startswith('q')])}", "l3"]
    out = read_everything_under_limit(m.mnt, many_records_ds, views, m.pid, 64)
    assert out["files"] == 3 * 1300
    st = m.stats()
    assert st.get("errors", {}) == {}, st.get("errors")
    rf = st["record_files"]     # the LRU really cycled: far more opens than it may hold
    assert rf["capacity"] < 64 and rf["open"] <= rf["capacity"]
    assert rf["opens"] >= 1300 and rf["evictions"] >= 1300 - rf["capacity"]
    assert f"record files open {rf['open']} of {rf['capacity']}" in run_pcrfs("status", m.mnt).stdout


def test_verify_and_export_work_under_a_small_limit(many_records_ds, tmp_path):
    import resource

    def lim():
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    run_pcrfs("export", many_records_ds, "q2", tmp_path / "q2", preexec_fn=lim)
    assert sum(1 for _ in (tmp_path / "q2").rglob("*.jpg")) == 1300


def test_descriptor_cache_never_closes_a_descriptor_in_use(tmp_path):
    """8 threads read 200 files through a 4-slot cache: each read sees its own file's
    bytes (a descriptor closed while in use, its number reused by another file, would
    show another file's bytes), and no more than capacity + busy stay open."""
    import os
    import random
    import threading

    from pcrfs.storage.fds import DescriptorCache
    paths = []
    for i in range(200):
        p = tmp_path / f"f{i}"
        p.write_bytes(f"file {i:04d}".encode() * 64)
        paths.append(p)
    cache = DescriptorCache(4)
    bad, peak = [], [0]

    def worker(seed):
        rnd = random.Random(seed)
        for _ in range(2000):
            i = rnd.randrange(200)
            with cache.use(i, str(paths[i])) as fd:
                if os.pread(fd, 9, 9 * 64 * 0 + 9 * rnd.randrange(64)) != f"file {i:04d}".encode():
                    bad.append(i)
                peak[0] = max(peak[0], cache.open_count())
    ts = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not bad
    assert peak[0] <= 4 + 8 and cache.open_count() <= 4
    assert cache.evictions > 1000
    cache.close()
    assert cache.open_count() == 0


def test_running_out_of_descriptors_is_reported_as_such(many_records_ds):
    """With every descriptor taken, a read fails as OutOfDescriptors (EMFILE), never as
    corrupt data, and succeeds again once descriptors are free."""
    import errno
    import subprocess
    import sys
    code = r'''
import os, resource, sys
from pcrfs import open_dataset
from pcrfs.errors import CorruptDataError
from pcrfs.storage.fds import OutOfDescriptors
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
ds = open_dataset(sys.argv[1])
ds.read("c0/im0000.jpg", "q1")
ds.storage.fds.shed()                     # nothing cached left to give back
hog = []
try:
    while True:
        hog.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
try:
    ds.read("c1/im0001.jpg", "q1")
    print("read with no descriptor left")
except CorruptDataError as e:
    print("corrupt", e)
except OutOfDescriptors as e:
    print("OUT", e.errno, e)
os.close(hog.pop()); os.close(hog.pop())
print("OK" if len(ds.read("c1/im0001.jpg", "q1")) > 100 else "short")
'''
    p = subprocess.run([sys.executable, "-c", code, str(many_records_ds)], capture_output=True, cwd="/",
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith(f"OUT {errno.EMFILE} ") and "LimitNOFILE" in lines[0], p.stdout
    assert lines[-1] == "OK", p.stdout
    assert not any(ln.startswith("corrupt") for ln in lines), p.stdout
