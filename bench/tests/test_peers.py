"""bench/peers.py's arms, tiny, on the CPU (issue 40): every system converts the same
ImageFolder with its own writer and feeds the bench's training input, so the comparison
cannot rot between `make bench` runs.  Nothing here is timed.

The images of class c are saturated in channel c, so each sample's colour after the crop,
flip and normalisation names its class: a loader that pairs an image with another's label,
drops or repeats images, or returns other shapes or dtypes fails here."""
import json
import subprocess
from collections import Counter

import numpy as np
import pytest
from PIL import Image

from bench import peers, peers_gpu

CLASSES, PER_CLASS = 3, 11


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("peers") / "src"
    rng = np.random.default_rng(40)
    for c in range(CLASSES):
        (root / f"class_{c}").mkdir(parents=True)
        for i in range(PER_CLASS):
            a = rng.integers(0, 60, (40 + 3 * i, 56 + 2 * i, 3), dtype=np.uint8)
            a[..., c] = 190 + rng.integers(0, 60, a.shape[:2], dtype=np.uint8)
            Image.fromarray(a).save(root / f"class_{c}" / f"{i:03d}.jpg", quality=88)
    return root


def test_every_arm_yields_the_right_batches(source, tmp_path):
    assert peers.PEERS_PY.exists(), "make setup creates .venv-peers"
    items = peers.items_of(source)
    assert Counter(c for _, c in items) == {c: PER_CLASS for c in range(CLASSES)}
    # one peers process answers every call in turn (the bench starts one per call)
    worker = peers.Worker(tmp_path / "peers.stderr")
    try:
        conv = peers.convert_all(source, items, tmp_path, call=worker)
        assert not [s for s, c in conv.items() if "error" in c], conv
        for s, c in conv.items():
            assert c["stored_bytes"] > 0, s
        # the tuned arm's view and the mix share (the bench asks `pcrfs tune`, which is
        # tested in test_liquid and would only add minutes here)
        peers.pcrfs("materialize", conv["pcrfs"]["path"], "raw", "--fraction", "0.5", "-q")
        choice = {"fidelity": 3, "share": 0.5, "ms_ssim": {}}
        rows = peers.cpu_local(conv, choice, items, tmp_path, rounds=1, batch=8, check=True,
                               call=worker)
    finally:
        worker.close()
    arms = {(r["system"], r["arm"]) for r in rows}
    assert {s for s, _ in arms} == set(peers.SYSTEMS)
    assert {a for s, a in arms if s == "pcrfs"} == {"q10", "tuned", "mix", "fused-tuned",
                                                    "fused-q10", "fused-source"}
    n = CLASSES * PER_CLASS
    for r in rows:
        name = f"{r['system']}/{r['arm']}"
        assert r["error"] is None, f"{name}: {r['error']}"
        chk = r["check"]
        assert chk["shapes"] == [[[3, 224, 224], "torch.float32"]], name
        assert chk["images"] == n, name
        assert {int(k): v for k, v in chk["labels"].items()} == {c: PER_CLASS for c in range(CLASSES)}, name
        assert chk["colour_miss"] == 0, name
        assert r["images_per_s"] > 0, name


def test_the_fused_source_arm_reads_the_source_objects_from_s3(source, tmp_path):
    """fused-source over S3: FastImageFolder's fused path over the source JPEGs fetched
    object by object from a real SeaweedFS (peer_arms._ObjectLoader), through the shaper:
    every image once with its own label, and every byte of the sources crossed the link."""
    import obstore
    from obstore.store import S3Store
    items = peers.items_of(source)
    with peers.s3(tmp_path) as (shaper, remote):
        store = S3Store(peers.BUCKET, endpoint=remote["endpoint"], region="us-east-1",
                        access_key_id=remote["key"], secret_access_key=remote["secret"],
                        virtual_hosted_style_request=False, client_options={"allow_http": True})
        for f in sorted(source.rglob("*.jpg")):
            obstore.put(store, f"dali/{f.relative_to(source).as_posix()}", f.read_bytes())
        shaper.set(None)
        b0 = shaper.sent()
        res = peers.call("epoch", "pcrfs-fused", {
            "items": items, "root": str(source), "batch": 8, "check": True,
            "objects": dict(remote, prefix="dali")})
        sent = shaper.sent() - b0
        # the mounted arms' epochs carry the bucket too ("remote"): they read their root's
        # files (the mount), never the source objects
        b0 = shaper.sent()
        mounted = peers.call("epoch", "pcrfs-fused", {
            "items": items, "root": str(source), "batch": 8, "remote": dict(remote, prefix="pcrfs")})
        total = sum(f.stat().st_size for f in source.rglob("*.jpg"))
        assert mounted["images"] == CLASSES * PER_CLASS and shaper.sent() - b0 < total / 10
    n = CLASSES * PER_CLASS
    assert res["images"] == n and res["colour_miss"] == 0
    assert res["shapes"] == [[[3, 224, 224], "torch.float32"]]
    assert {int(k): v for k, v in res["labels"].items()} == {c: PER_CLASS for c in range(CLASSES)}
    assert sent >= sum(f.stat().st_size for f in source.rglob("*.jpg"))


def test_a_failing_peer_keeps_its_row_with_the_error(tmp_path):
    """A system that cannot run reports its exact error instead of vanishing, from a
    process of its own (the bench) and from the long-lived one (the tests)."""
    with pytest.raises(peers.PeerError, match="no writer for nothing"):
        peers.call("convert", "nothing", {"items": [], "out": str(tmp_path / "x")})
    worker = peers.Worker(tmp_path / "w.stderr")
    try:
        with pytest.raises(peers.PeerError, match="no writer for nothing"):
            worker("convert", "nothing", {"items": [], "out": str(tmp_path / "y")})
        assert worker("convert", "dali", {"items": [], "out": str(tmp_path / "z")})["images"] == 0
    finally:
        worker.close()


def test_the_shaper_limits_and_counts_what_it_is_given(tmp_path):
    """The one bandwidth limit of the S3 regimes: tc's HTB class on the loopback port,
    whose byte counter is every system's bytes_read."""
    import socket
    import threading
    import time
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    shaper = peers.Shaper(port)
    payload = b"x" * (3 << 20)

    def serve():
        conn, _ = srv.accept()
        conn.sendall(payload)
        conn.close()
    try:
        shaper.set(10)        # 10 MB/s: 3 MiB take >= ~0.3 s (the burst is 256 KiB)
        th = threading.Thread(target=serve)
        th.start()
        c = socket.create_connection(("127.0.0.1", port))
        t0, got = time.perf_counter(), 0
        while chunk := c.recv(1 << 16):
            got += len(chunk)
        took = time.perf_counter() - t0
        th.join()
        assert got == len(payload)
        assert took >= 0.25, f"3 MiB in {took:.3f} s: not limited to 10 MB/s"
        assert shaper.sent() >= len(payload)
    finally:
        shaper.clear()
        srv.close()
    out = subprocess.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True).stdout
    assert "htb" not in out


def test_gpu_regime_arms_yield_the_right_batches_on_the_cpu(source, tmp_path):
    """bench/peers_gpu.py's arms, with the device the CPU: unmodified ImageFolder listings
    of MNT/l3 decoded by decode_batch, and the source JPEGs by decode_jpeg, each read by 2
    loader processes or by threads of this process, into cropped, flipped, normalized
    float batches."""
    from bench.common import Mounted
    ds = tmp_path / "ds"
    peers.pcrfs("build", source, ds, "-q")
    files = peers_gpu.items_of(source)
    n = CLASSES * PER_CLASS
    with Mounted(ds, tmp_path / "mnt") as m:
        l3 = peers_gpu.items_of(m.mnt / "l3", suffix=".l3")
        assert [y for _, y in l3] == [y for _, y in files]
        assert all(p.endswith(".l3") for p, _ in l3) and len(l3) == n
        got = {f"{arm}{'_threads' if thr else ''}":
               peers_gpu.epoch(it, arm, "cpu", batch=8, workers=2, check=True, threads=thr)
               for arm, it in (("l3", l3), ("nvjpeg", files)) for thr in (0, 3)}
        # the GPUImageFolder arms: MNT/q10, a lower view, the sources
        folders = {r: peers_gpu.folder_epoch(r, "cpu", batch=8, threads=2, check=True)
                   for r in (m.mnt / "q10", m.mnt / "q3", source)}
    for r, g in folders.items():
        assert g["images"] == n and g["skipped"] == 0, r
        assert g["labels"] == {c: PER_CLASS for c in range(CLASSES)}, r
    assert len(got) == 4
    for arm, g in got.items():
        assert g["shapes"] == [((3, 224, 224), "torch.float32", "cpu")], arm
        assert g["images"] == n, arm
        assert g["labels"] == {c: PER_CLASS for c in range(CLASSES)}, arm
        assert g["colour_miss"] == 0, arm
        assert g["rate"] > 0, arm


def test_a_run_of_some_regimes_keeps_the_others_rows_and_their_choice(tmp_path):
    """--regimes s3 after a full run: the cpu_local rows stay, marked with their run's
    time, and so does the tuned fidelity they were measured with, though `pcrfs tune`
    picked another this time; a run of another source keeps nothing."""
    conv = {s: {"stored_bytes": 1} for s in peers.SYSTEMS}

    def res(rows, fidelity, source="src"):
        return {"source": source, "images": 4, "conversion": conv, "rows": rows,
                "pcrfs_choice": {"fidelity": fidelity}, "cpu_profile": None}
    old_rows = [{"system": "pcrfs", "arm": "tuned", "regime": "cpu_local", "images_per_s": 9.0},
                {"system": "pcrfs", "arm": "tuned", "regime": "s3_5MBps", "images_per_s": 1.0}]
    path = tmp_path / "peers.json"
    path.write_text(json.dumps({"time": "then", "result": res(old_rows, 3)}))
    new = [{"system": "pcrfs", "arm": "tuned", "regime": "s3_5MBps", "images_per_s": 2.0}]
    got = peers.merge_previous(path, res([dict(r) for r in new], 10))
    assert [(r["regime"], r["images_per_s"], r["measured"] == "then") for r in got["rows"]] == [
        ("cpu_local", 9.0, True), ("s3_5MBps", 2.0, False)]
    assert got["pcrfs_choice"] == {"fidelity": 3}
    assert got["pcrfs_choice_this_run"] == {"fidelity": 10}
    other = peers.merge_previous(path, res([dict(r) for r in new], 10, source="elsewhere"))
    assert [r["regime"] for r in other["rows"]] == ["s3_5MBps"]
    assert other["pcrfs_choice"] == {"fidelity": 10}


def test_the_bounded_cache_arm_picks_the_highest_view_that_fits_and_an_overrun_is_not_compared():
    """second_epoch_30pct: the tuned arm reads the highest fidelity whose whole view fits the
    cache bound (so every image of the second epoch may hit), and a peer whose cache grew
    past its bound is listed, not compared: its hit ratio was not bought with 30%."""
    choice = {"fidelity": 10, "ms_ssim": {}, "view_bytes": {"q1": 10, "q2": 25, "q3": 30, "q4": 31}}
    assert peers.fitting_choice(choice, 30)["fidelity"] == 3
    assert peers.fitting_choice(choice, 30)["view_bytes"] == 30
    # the tuned arm then reads that q view, whatever view the local choice named
    assert peers.fitting_choice({**choice, "view": "b5"}, 30)["view"] == "q3"
    assert peers.fitting_choice(choice, 9) is None
    assert peers.fitting_choice({"fidelity": 3}, 100) is None      # no sizes: no arm
    conv = {s: {"stored_bytes": 1} for s in peers.SYSTEMS}

    def row(system, arm, hit, within):
        return {"system": system, "arm": arm, "regime": "second_epoch_30pct", "images_per_s": 1.0,
                "hit_ratio": hit, "within_bound": within}
    rows = [row("pcrfs", "q10", 0.3, True), row("pcrfs", "tuned", 0.97, True),
            row("webdataset", "webdataset", 0.99, False), row("litdata", "litdata", 0.0, True),
            row("dali", "dali", 0.0, None)]
    t = peers.targets(rows, conv)["second_epoch_30pct_hit_ratio"]
    assert t["pcrfs"] == 0.97 and t["pcrfs_arms"] == {"q10": 0.3, "tuned": 0.97}
    assert t["peers_over_their_bound"] == ["webdataset"] and t["met"] is True
    rows[3]["hit_ratio"] = 0.98
    assert peers.targets(rows, conv)["second_epoch_30pct_hit_ratio"]["met"] is False
