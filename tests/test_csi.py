"""`pcrfs csi`, the Kubernetes CSI node plugin, driven as kubelet drives it: a real gRPC
client on the plugin's unix socket, volumes published through the real kernel (one
supervised mount per volume, whose supervisor mount(2)s /dev/fuse and hands it to `pcrfs
mount SRC /dev/fd/N`; each pod's target is a bind mount of it)."""
import errno
import os
import shutil
import subprocess
import time

import grpc
import pytest

import pcrfs
from pcrfs.csi import csi_pb2 as pb
from pcrfs.csi import csi_pb2_grpc as pbg

from conftest import PCRFS, wait_until

pytestmark = [pytest.mark.mounts, pytest.mark.servers]   # the plugin mounts; it is a server


def start_plugin(tmp_path):
    sock = tmp_path / "csi" / "csi.sock"
    if sock.exists():
        sock.unlink()
    # under tini, as deploy/Dockerfile runs it (-s: a subreaper here, where it is not PID 1):
    # the supervisors that `pcrfs mount` leaves are reaped when their volumes go
    out = open(tmp_path / "plugin.out", "a")
    proc = subprocess.Popen([shutil.which("tini"), "-s", "--", PCRFS, "csi", "--endpoint",
                             f"unix://{sock}", "--node-id", "node-7",
                             "--state-dir", str(tmp_path / "state")],
                            stdout=out, stderr=subprocess.STDOUT, text=True)
    out.close()
    wait_until(lambda: sock.exists() or proc.poll() is not None, 60, "the plugin's socket")
    assert proc.poll() is None, (tmp_path / "plugin.out").read_text()
    channel = grpc.insecure_channel(f"unix:{sock}")
    grpc.channel_ready_future(channel).result(timeout=60)
    return proc, channel


def kill_plugin(tini: subprocess.Popen) -> None:
    """SIGKILL the plugin itself (tini's child; tini then exits with it).  Its other
    children are the volumes' supervisors, orphaned to it (a subreaper)."""
    with open(f"/proc/{tini.pid}/task/{tini.pid}/children") as f:
        children = [int(p) for p in f.read().split()]
    (plugin,) = [p for p in children if b"\0csi\0" in open(f"/proc/{p}/cmdline", "rb").read()]
    os.kill(plugin, 9)
    tini.wait(timeout=60)


@pytest.fixture
def plugin(tmp_path):
    proc, channel = start_plugin(tmp_path)
    try:
        yield pbg.IdentityStub(channel), pbg.NodeStub(channel), channel
    finally:
        channel.close()
        proc.terminate()
        proc.wait(timeout=60)
        for line in open("/proc/self/mountinfo"):   # what a failed test left behind
            if str(tmp_path) in line.split()[4]:
                subprocess.run(["umount", "-l", line.split()[4]], capture_output=True)


def mount_cap(mode=pb.VolumeCapability.AccessMode.MULTI_NODE_READER_ONLY):
    return pb.VolumeCapability(mount=pb.VolumeCapability.MountVolume(),
                               access_mode=pb.VolumeCapability.AccessMode(mode=mode))


def is_mounted(path) -> bool:
    return any(line.split()[4] == str(path) for line in open("/proc/self/mountinfo"))


def test_identity_and_node_info(plugin):
    identity, node, _ = plugin
    info = identity.GetPluginInfo(pb.GetPluginInfoRequest())
    assert info.name == "csi.pcrfs.dev" and info.vendor_version
    assert identity.Probe(pb.ProbeRequest()).ready.value is True
    assert list(identity.GetPluginCapabilities(pb.GetPluginCapabilitiesRequest()).capabilities) == []
    assert node.NodeGetInfo(pb.NodeGetInfoRequest()).node_id == "node-7"
    assert list(node.NodeGetCapabilities(pb.NodeGetCapabilitiesRequest()).capabilities) == []


def test_publish_serves_the_dataset_and_unpublish_removes_it(plugin, crops_ds, tmp_path):
    _, node, channel = plugin
    target = tmp_path / "pods" / "uid-1" / "volumes" / "pcrfs"
    target.parent.mkdir(parents=True)
    req = pb.NodePublishVolumeRequest(volume_id="imagenet", target_path=str(target),
                                      volume_capability=mount_cap(), readonly=True,
                                      volume_context={"source": str(crops_ds),
                                                      "cacheSize": "64M"})
    node.NodePublishVolume(req)
    assert is_mounted(target)
    node.NodePublishVolume(req)                    # again: idempotent, nothing new mounted
    assert sum(line.split()[4] == str(target) for line in open("/proc/self/mountinfo")) == 1
    from torchvision.datasets import ImageFolder  # what a training pod runs
    folder = ImageFolder(str(target / "q5"))
    assert len(folder) == 240 and len(folder.classes) == 8
    img, label = folder[17]
    assert img.size == (500, 375) and folder.classes[label] in os.listdir(target / "q5")
    ds = pcrfs.open_dataset(str(crops_ds))
    cls = sorted(os.listdir(target / "q5"))[0]
    for name in sorted(os.listdir(target / "q5" / cls))[:8]:
        assert (target / "q5" / cls / name).read_bytes() == ds.read(f"{cls}/{name}".encode(), "q5")
    with pytest.raises(OSError) as e:
        open(target / "q5" / cls / "new.jpg", "wb")
    assert e.value.errno == errno.EROFS
    stats = __import__("json").loads((target / ".pcrfs" / "stats.json").read_text())
    pid, sup = int(stats["pid"]), int(stats["supervisor"]["pid"])
    # the volume's log on the plugin's stdout (kubectl logs), tagged
    wait_until(lambda: any(ln.startswith("[volume imagenet] ") and "serving" in ln
                           for ln in (tmp_path / "plugin.out").read_text().splitlines()),
               30, "the volume's log lines on the plugin's stdout")
    # another volume at the same target is refused
    other = pb.NodePublishVolumeRequest(volume_id="other", target_path=str(target),
                                        volume_capability=mount_cap(), readonly=True,
                                        volume_context={"source": str(crops_ds)})
    with pytest.raises(grpc.RpcError) as e:
        node.NodePublishVolume(other)
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
    node.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id="imagenet",
                                                           target_path=str(target)))
    assert not is_mounted(target) and not target.exists()
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{pid}") or os.path.exists(f"/proc/{sup}"):
        assert time.monotonic() < deadline, "the daemon or its supervisor outlived its " \
            "volume (or was left a zombie: nothing reaped it)"
        time.sleep(0.05)
    node.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id="imagenet",
                                                           target_path=str(target)))  # idempotent


def test_bad_requests_get_clear_errors_and_leave_nothing_mounted(plugin, crops_ds, tmp_path):
    _, node, channel = plugin
    target = tmp_path / "t"

    def publish(**kw):
        args = dict(volume_id="v", target_path=str(target), volume_capability=mount_cap(),
                    volume_context={"source": str(crops_ds)})
        args.update(kw)
        with pytest.raises(grpc.RpcError) as e:
            node.NodePublishVolume(pb.NodePublishVolumeRequest(**args))
        return e.value
    e = publish(volume_capability=pb.VolumeCapability(block=pb.VolumeCapability.BlockVolume()))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "block" in e.details()
    e = publish(volume_capability=mount_cap(pb.VolumeCapability.AccessMode.SINGLE_NODE_WRITER))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "read-only" in e.details()
    e = publish(target_path="")
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    e = publish(volume_context={"source": str(tmp_path / "no-such-dataset")})
    assert e.code() == grpc.StatusCode.INTERNAL and "no-such-dataset" in e.details()
    assert not is_mounted(target)
    assert not any(str(tmp_path) in ln.split()[4] for ln in open("/proc/self/mountinfo"))
    # bad attributes: INVALID_ARGUMENT, naming the attribute
    for ctx, named in (({"source": str(crops_ds), "cacheSize": "lots"}, "cacheSize"),
                       ({"source": str(crops_ds), "options": "warp=9"}, "options"),
                       ({"source": str(crops_ds), "fidelity": "best"}, "fidelity"),
                       ({"source": str(crops_ds), "cachesize": "1G"}, "'cachesize'"),
                       ({"source": str(crops_ds), "shard": "5/4"}, "shard"),
                       ({"source": str(crops_ds), "peerBandwidthLimit": "fast"},
                        "peerBandwidthLimit"),
                       # a CSI volume is always supervised: supervise=no left its staging
                       # mount behind (a KeyError after the mount)
                       ({"source": str(crops_ds), "options": "supervise=no"}, "supervised")):
        e = publish(volume_context=ctx)
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and named in e.details(), e.details()
    # a Secret sets credentials in the root daemon's environment, never the loader's
    for key in ("LD_PRELOAD", "PYTHONPATH", "PATH", "aws_secret"):
        e = publish(secrets={key: "/tmp/x.so", "AWS_ACCESS_KEY_ID": "k"})
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and repr(key) in e.details(), e.details()
    assert not is_mounted(target)
    assert not any(str(tmp_path) in ln.split()[4] for ln in open("/proc/self/mountinfo"))
    # not offered (NodeGetCapabilities says so): kubelet never stages
    stage = channel.unary_unary("/csi.v1.Node/NodeStageVolume",
                                request_serializer=lambda b: b, response_deserializer=lambda b: b)
    with pytest.raises(grpc.RpcError) as e:
        stage(b"")
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED


def stats(path) -> dict:
    import json
    return json.loads((path / ".pcrfs" / "stats.json").read_text())


def test_pods_share_one_supervised_daemon_that_outlives_crashes_and_the_plugin(
        crops_ds, tmp_path):
    """Two pods publish one volume: one daemon serves both (bind mounts).  The daemon is
    SIGKILLed: its supervisor restarts it and the pods keep reading.  The plugin is
    SIGKILLed and started again: the mounts keep serving, and the new plugin unpublishes
    them; the last unpublish stops the daemon and its supervisor."""
    proc, channel = start_plugin(tmp_path)
    node = pbg.NodeStub(channel)
    targets = [tmp_path / "pods" / f"uid-{i}" / "volumes" / "pcrfs" for i in range(2)]
    ds = pcrfs.open_dataset(str(crops_ds))
    cls = sorted(os.listdir(crops_ds.parent / "src"))[0]
    names = sorted(os.listdir(crops_ds.parent / "src" / cls))[:6]

    def reads_right(target) -> bool:
        return all((target / "q5" / cls / n).read_bytes() == ds.read(f"{cls}/{n}".encode(), "q5")
                   for n in names)
    try:
        for t in targets:
            t.parent.mkdir(parents=True)
            node.NodePublishVolume(pb.NodePublishVolumeRequest(
                volume_id="imagenet", target_path=str(t), volume_capability=mount_cap(),
                readonly=True, volume_context={"source": str(crops_ds)}))
        first, second = (stats(t) for t in targets)
        assert first["pid"] == second["pid"]           # one daemon for the node's pods
        assert first["supervisor"]["pid"] == second["supervisor"]["pid"]
        assert all(reads_right(t) for t in targets)
        os.kill(first["pid"], 9)
        assert all(reads_right(t) for t in targets)     # waits out the restart, no error
        assert stats(targets[0])["restarts"] == 1
        kill_plugin(proc)
        channel.close()
        assert all(reads_right(t) for t in targets)     # no plugin: the mounts serve on
        proc, channel = start_plugin(tmp_path)
        node = pbg.NodeStub(channel)
        daemon, sup = stats(targets[0])["pid"], first["supervisor"]["pid"]
        node.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id="imagenet",
                                                               target_path=str(targets[0])))
        assert not is_mounted(targets[0]) and reads_right(targets[1])
        node.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id="imagenet",
                                                               target_path=str(targets[1])))
        assert not is_mounted(targets[1])
        wait_until(lambda: not os.path.exists(f"/proc/{daemon}/cmdline")
                   or not open(f"/proc/{daemon}/cmdline").read(), 30, "the daemon to exit")
        wait_until(lambda: not os.path.exists(f"/proc/{sup}/cmdline")
                   or not open(f"/proc/{sup}/cmdline").read(), 30, "the supervisor to exit")
        assert not any(str(tmp_path) in ln.split()[4] for ln in open("/proc/self/mountinfo"))
    finally:
        ds.close()
        channel.close()
        proc.terminate()
        proc.wait(timeout=60)
        for line in open("/proc/self/mountinfo"):
            if str(tmp_path) in line.split()[4]:
                subprocess.run(["umount", "-l", line.split()[4]], capture_output=True)
