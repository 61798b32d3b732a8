"""`pcrfs csi`, the Kubernetes CSI node plugin, driven as kubelet drives it: a real gRPC
client on the plugin's unix socket, volumes published through the real kernel (the
plugin opens /dev/fuse, mount(2)s it with fd=N and starts `pcrfs mount SRC /dev/fd/N`)."""
import errno
import os
import subprocess
import time

import grpc
import pytest

import pcrfs
from pcrfs.csi import csi_pb2 as pb
from pcrfs.csi import csi_pb2_grpc as pbg

from conftest import PCRFS

pytestmark = [pytest.mark.mounts, pytest.mark.servers]   # the plugin mounts; it is a server


@pytest.fixture
def plugin(tmp_path):
    sock = tmp_path / "csi" / "csi.sock"
    proc = subprocess.Popen([PCRFS, "csi", "--endpoint", f"unix://{sock}", "--node-id", "node-7",
                             "--state-dir", str(tmp_path / "state")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not sock.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.05)
    channel = grpc.insecure_channel(f"unix:{sock}")
    grpc.channel_ready_future(channel).result(timeout=60)
    try:
        yield pbg.IdentityStub(channel), pbg.NodeStub(channel), channel
    finally:
        channel.close()
        proc.terminate()
        proc.wait(timeout=60)


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
    ds = pcrfs.open_dataset(str(crops_ds))
    cls = sorted(os.listdir(target / "q5"))[0]
    for name in sorted(os.listdir(target / "q5" / cls))[:8]:
        assert (target / "q5" / cls / name).read_bytes() == ds.read(f"{cls}/{name}".encode(), "q5")
    with pytest.raises(OSError) as e:
        open(target / "q5" / cls / "new.jpg", "wb")
    assert e.value.errno == errno.EROFS
    pid = int(__import__("json").loads((target / ".pcrfs" / "stats.json").read_text())["pid"])
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
    while os.path.exists(f"/proc/{pid}"):
        assert time.monotonic() < deadline, "the daemon outlived its volume"
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
    # not offered (NodeGetCapabilities says so): kubelet never stages
    stage = channel.unary_unary("/csi.v1.Node/NodeStageVolume",
                                request_serializer=lambda b: b, response_deserializer=lambda b: b)
    with pytest.raises(grpc.RpcError) as e:
        stage(b"")
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
