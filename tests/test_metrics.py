"""Prometheus metrics of a live mount, scraped by a real Prometheus (Debian's package)."""
import json
import os
import re
import socket
import sys
import time
import urllib.request
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

from testkit.servers import Prometheus, free_ports

from conftest import REPO, run_pcrfs

sys.path.insert(0, str(REPO / "tools"))
import metrics_doc  # noqa: E402

from pcrfs.telemetry import metrics  # noqa: E402

DOC = REPO / "docs" / "METRICS.md"


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def _read_all(root: Path) -> int:
    n = 0
    for p in _files(root):
        n += len(p.read_bytes())
    return n


def _scrape(endpoint: str) -> str:
    with urllib.request.urlopen(endpoint, timeout=10) as r:
        return r.read().decode()


def _families(text: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families
    return {f.name: f for f in text_string_to_metric_families(text)}


def _poll(fn, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_prometheus_scrapes_bytes_per_view_with_labels(corpus_ds, mount, tmp_path):
    (port,) = free_ports(1)
    m = mount(corpus_ds, "-o", f"metrics=127.0.0.1:{port},metrics_labels=team=vision,run=r50")
    assert m.stats()["metrics_endpoint"] == f"http://127.0.0.1:{port}/metrics"
    prom = Prometheus(tmp_path / "prom", [f"127.0.0.1:{port}"])
    prom.start()
    try:
        read_q3 = _read_all(m.mnt / "q3")
        read_q10 = _read_all(m.mnt / "q10")
        uuid = json.loads((corpus_ds / "manifest.json").read_text())["uuid"]

        def served(view):
            r = prom.query(f'pcrfs_served_bytes_total{{view="{view}"}}')
            return r if r and float(r[0]["value"][1]) == {"q3": read_q3, "q10": read_q10}[view] \
                else None
        (q3,) = _poll(lambda: served("q3"), "Prometheus to see the q3 bytes read")
        _poll(lambda: served("q10"), "Prometheus to see the q10 bytes read")
        labels = q3["metric"]
        assert labels["mountpoint"] == str(m.mnt) and labels["dataset_uuid"] == uuid
        assert labels["team"] == "vision" and labels["run"] == "r50"
        files = len(_files(m.mnt / "q3"))
        (n,) = prom.query('pcrfs_served_files_total{view="q3"}')
        assert float(n["value"][1]) == files
        # latency histograms of Python's requests and of the storage calls (the lane reads
        # q-view files in C; l3/ files are made by Python, from the records)
        for p in _files(m.mnt / "l3")[:4]:    # each one a transcode: a few suffice
            p.read_bytes()
        (reads,) = _poll(lambda: prom.query(
            'sum(pcrfs_backend_fetch_duration_seconds_count{op=~"pread.*"})'), "backend histogram")
        assert float(reads["value"][1]) > 0
        (lookups,) = prom.query('pcrfs_fuse_request_duration_seconds_count{op="lookup"}')
        assert float(lookups["value"][1]) > 0
        q = prom.query('histogram_quantile(0.5, sum by (le) '
                       '(pcrfs_backend_fetch_duration_seconds_bucket{op=~"pread.*"}))')
        assert 0 < float(q[0]["value"][1]) < 30
        (info,) = prom.query("pcrfs_info")
        assert info["metric"]["source"] == str(corpus_ds)
    finally:
        prom.stop()


def test_docs_list_exactly_what_the_endpoint_serves(corpus_ds, mount):
    assert DOC.read_text() == metrics_doc.render(), \
        "docs/METRICS.md is stale: run tools/metrics_doc.py"
    (port,) = free_ports(1)
    m = mount(corpus_ds, "-o", f"metrics={port}")
    _read_all(m.mnt / "q2")
    served = {n for n in _families(_scrape(f"http://127.0.0.1:{port}/metrics"))
              if n.startswith("pcrfs_")}
    documented = set()
    for name, kind in re.findall(r"^\| `(pcrfs_\w+)`[^|]*\| (\w+) \|", DOC.read_text(), re.M):
        documented.add(name[:-len("_total")] if kind == "counter" else name)
    assert served == documented
    # every family is there before anything happened to fill it
    assert {m_.name for m_ in metrics.METRICS} <= {n[len("pcrfs_"):] for n in served}


def _numeric_leaves(node, path=()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _numeric_leaves(v, (*path, k))
    elif isinstance(node, (int, float)) or path[-1:] == ("dynamic_fidelity",):  # "q10"
        yield ".".join(path)


def test_every_stats_json_number_is_a_metric(corpus_ds, mount):
    (port,) = free_ports(1)
    m = mount(corpus_ds, "-o", f"metrics={port},cache_policy=static")
    _read_all(m.mnt / "q3")
    for p in _files(m.mnt / "l3")[:4]:
        p.read_bytes()
    os.listdir(m.mnt / "dynamic")
    s = m.stats()
    patterns = [x.covers for x in metrics.METRICS] + sorted(metrics.NOT_EXPORTED)
    leaves = list(_numeric_leaves(s))
    assert "served_bytes.q3" in leaves and "cache_tiers.memory.hits" in leaves
    missing = [p for p in leaves if not any(fnmatchcase(p, pat) and p.count(".") ==
                                            pat.count(".") for pat in patterns)]
    assert missing == []
    # and the value a metric carries is the stats.json one
    fams = _families(_scrape(f"http://127.0.0.1:{port}/metrics"))
    tiers = {smp.labels["tier"]: smp.value for smp in fams["pcrfs_cache_tier_capacity_bytes"].samples}
    assert tiers["readahead"] == m.stats()["cache_tiers"]["readahead"]["capacity"] > 0
    # under static the lane's store is the pinned set
    (kept,) = fams["pcrfs_lane_store_kept"].samples
    assert kept.value == m.stats()["fast_lane"]["store_kept"] > 0


def test_textfile_mode_for_node_exporter(corpus_ds, mount, tmp_path):
    prom = tmp_path / "textfile" / "pcrfs.prom"
    prom.parent.mkdir()
    m = mount(corpus_ds, "-o", f"metrics_textfile={prom},metrics_interval=0.2")
    assert "metrics_endpoint" not in m.stats()
    n = _read_all(m.mnt / "q5")

    def current():
        try:
            fams = _families(prom.read_text())
        except FileNotFoundError:
            return None
        got = [s.value for s in fams["pcrfs_served_bytes"].samples
               if s.name == "pcrfs_served_bytes_total" and s.labels["view"] == "q5"]
        return got == [n]
    _poll(current, "the textfile to show the q5 bytes")
    assert not list(prom.parent.glob("*.tmp*"))     # written whole, then renamed


def test_bad_metrics_options_are_refused_clearly(corpus_ds, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    for opt, says in (("metrics=notaport", "expected PORT or HOST:PORT"),
                      ("metrics=1,metrics_labels=9lives=1", "label name"),
                      ("metrics=1,metrics_labels=mountpoint=x", "pcrfs sets itself"),
                      ("metrics_interval=0", "positive number")):
        p = run_pcrfs("mount", corpus_ds, mnt, "-o", opt, check=False)
        assert p.returncode != 0 and says in p.stderr, (opt, p.stderr)
        assert not os.path.ismount(mnt)
    with socket.socket() as busy:   # the port is taken: the mount fails, nothing is mounted
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        p = run_pcrfs("mount", corpus_ds, mnt, "-o", f"metrics={port}", check=False)
        assert p.returncode != 0 and "cannot listen" in p.stderr, p.stderr
        assert not os.path.ismount(mnt)


@pytest.mark.parametrize("url, label", [
    ("https://user:secret@example.com:8443/data/ds?X-Amz-Signature=abc#frag",
     "https://example.com:8443/data/ds"),
    ("s3://bucket/prefix", "s3://bucket/prefix"),
    ("/local/dataset", "/local/dataset")])
def test_urls_lose_their_credentials_in_labels(url, label):
    assert metrics.safe_source(url) == label


def test_option_parser_reads_labels_after_commas():
    from pcrfs.fs.options import parse_mount_options
    mo = parse_mount_options(["metrics=0.0.0.0:9567,metrics_labels=team=vision,run=r50,"
                              "cache_policy=static"])
    assert mo.metrics == ("0.0.0.0", 9567) and mo.cache_policy == "static"
    assert mo.metrics_labels == {"team": "vision", "run": "r50"}
    assert parse_mount_options(["metrics=9100"]).metrics == ("127.0.0.1", 9100)


def test_snapshots_for_other_threads_are_taken_on_the_trio_thread():
    """The stats dicts change only on the trio thread: a scrape from the exporter's thread
    takes its snapshot there (fs/loop.py), not by walking them from its own thread; before
    the loop runs and after it ends, directly."""
    import threading

    import trio

    from pcrfs.fs.loop import OnLoop
    on = OnLoop()
    here = threading.get_ident()
    assert on.call(threading.get_ident) == here            # no loop yet
    seen = {}

    async def main():
        on.bind()
        seen["loop"] = threading.get_ident()
        seen["scrape"] = await trio.to_thread.run_sync(
            lambda: (threading.get_ident(), on.call(threading.get_ident)))

    trio.run(main)
    scraper, ran_on = seen["scrape"]
    assert scraper != seen["loop"] and ran_on == seen["loop"]
    out = []
    t = threading.Thread(target=lambda: out.append(on.call(threading.get_ident)))
    t.start()
    t.join()
    assert out == [t.ident]                                 # the loop ended: directly


def test_each_counter_is_declared_once_in_the_stats_table():
    """pcrfs.telemetry.stats.COUNTS is the one table of Stats's counters: Stats has exactly its
    attributes, stats.json exactly its keys (plus pid and uptime), and METRICS exports each
    exported row once, under its name, help and label, with nothing else claiming it."""
    from pcrfs.telemetry.stats import COUNTS, Stats
    st = Stats()
    st.add(backend_bytes=3)
    st.count("served_bytes", "q3", 5)
    snap = st.snapshot()
    assert set(snap) == {c.key for c in COUNTS} | {"pid", "uptime_s"}
    assert snap["backend_bytes"] == 3 and snap["served_bytes"] == {"q3": 5}
    by_cover = {}
    for m in metrics.METRICS:
        by_cover.setdefault(m.covers, []).append(m)
    for c in COUNTS:
        found = by_cover.get(f"{c.key}.*" if c.keyed else c.key, [])
        if c.metric is None:
            assert found == [] and c.key in metrics.NOT_EXPORTED, c
            continue
        assert len(found) == 1, c
        (m,) = found
        assert (m.name, m.kind, m.help, m.label) == (c.metric or c.key, "counter", c.help, c.label)
