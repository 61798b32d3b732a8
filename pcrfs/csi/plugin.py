"""The CSI node plugin: kubelet asks it, over a unix socket, to publish a volume (a pcrfs
dataset) at a pod's target path and to unpublish it.

Publishing follows the pattern of the mountpoint-s3, gcsfuse and meta-fuse-csi-plugin
drivers: this privileged process opens /dev/fuse, calls mount(2) with `fd=N` at the target
path, and starts `pcrfs mount SOURCE /dev/fd/N`, which only serves the descriptor.  The
daemon runs with the volume's secrets as its environment (cloud credentials), never on a
command line or in a log.  Unpublishing unmounts the target (lazily, so a pod's open files
never block it) and stops the daemon.

A volume is a PersistentVolume with `csi.driver: csi.pcrfs.dev`.  Its volumeAttributes
(volume_context) say what to serve:
  source          the dataset: a directory on the node, or s3://, gs://, az://, http(s)://
                  (default: the volume handle itself)
  options         pcrfs mount -o options, comma-separated (e.g. "skip_open=yes")
  cacheSize, cacheDir, cacheDirSize, fidelity, bandwidthLimit
                  --cache-size, --cache-dir, --cache-dir-size, --fidelity, --bandwidth-limit
Only read access modes are accepted: pcrfs is read-only."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent import futures

from pcrfs.errors import PcrfsError
from pcrfs.fs.kmount import fuse_mount, is_mounted, unmount

log = logging.getLogger("pcrfs.csi")
NAME = "csi.pcrfs.dev"
FLAGS = {"cacheSize": "--cache-size", "cacheDir": "--cache-dir", "cacheDirSize": "--cache-dir-size",
         "fidelity": "--fidelity", "bandwidthLimit": "--bandwidth-limit"}
STOP_TIMEOUT = 30.0


def _pb():
    try:
        from pcrfs.csi import csi_pb2, csi_pb2_grpc
    except ImportError as e:
        raise PcrfsError(f"pcrfs csi needs grpcio and protobuf (pip install 'pcrfs[csi]'): {e}") from None
    return csi_pb2, csi_pb2_grpc


class Published:
    """What this node serves: target path -> (volume id, daemon pid), kept in a state file
    so that a restarted plugin still unpublishes what it published."""

    def __init__(self, state_dir: str):
        os.makedirs(state_dir, exist_ok=True)
        self.path = os.path.join(state_dir, "published.json")
        self.lock = threading.Lock()

    def load(self) -> dict:
        try:
            with open(self.path) as f:
                return json.load(f)
        except FileNotFoundError:
            return {}

    def save(self, table: dict) -> None:
        from pcrfs.format.manifest import write_json_atomic
        write_json_atomic(self.path, table)


def make_server(node_id: str, endpoint: str, state_dir: str, pcrfs_cmd: list[str] | None = None):
    """A started grpc.Server on `endpoint` (unix:///path) serving Identity and Node."""
    import grpc
    pb, pbg = _pb()
    published = Published(state_dir)
    cmd = pcrfs_cmd or [_pcrfs_script()]

    def fail(context, code, message):
        log.warning("%s", message)
        context.abort(code, message)

    class Identity(pbg.IdentityServicer):
        def GetPluginInfo(self, request, context):  # noqa: N802 - the spec's names
            from importlib.metadata import version
            return pb.GetPluginInfoResponse(name=NAME, vendor_version=version("pcrfs"))

        def GetPluginCapabilities(self, request, context):  # noqa: N802
            return pb.GetPluginCapabilitiesResponse()     # a node plugin: no controller

        def Probe(self, request, context):  # noqa: N802
            from google.protobuf.wrappers_pb2 import BoolValue
            return pb.ProbeResponse(ready=BoolValue(value=os.path.exists("/dev/fuse")))

    class Node(pbg.NodeServicer):
        def NodeGetInfo(self, request, context):  # noqa: N802
            return pb.NodeGetInfoResponse(node_id=node_id)

        def NodeGetCapabilities(self, request, context):  # noqa: N802
            return pb.NodeGetCapabilitiesResponse()       # no staging, stats or expansion

        def NodePublishVolume(self, request, context):  # noqa: N802
            target = request.target_path
            if not request.volume_id or not target:
                fail(context, grpc.StatusCode.INVALID_ARGUMENT, "volume_id and target_path are required")
            cap = request.volume_capability
            if not request.HasField("volume_capability") or not cap.HasField("mount"):
                fail(context, grpc.StatusCode.INVALID_ARGUMENT,
                     f"volume {request.volume_id}: pcrfs publishes mount volumes only (no block)")
            mode = cap.access_mode.mode
            readers = (pb.VolumeCapability.AccessMode.SINGLE_NODE_READER_ONLY,
                       pb.VolumeCapability.AccessMode.MULTI_NODE_READER_ONLY)
            if mode not in readers and not request.readonly:
                fail(context, grpc.StatusCode.INVALID_ARGUMENT,
                     f"volume {request.volume_id}: pcrfs is read-only; access mode "
                     f"{pb.VolumeCapability.AccessMode.Mode.Name(mode)} needs writes")
            with published.lock:
                table = published.load()
                old = table.get(target)
                if old is not None and is_mounted(target):
                    if old["volume_id"] == request.volume_id:
                        return pb.NodePublishVolumeResponse()   # published already
                    fail(context, grpc.StatusCode.ALREADY_EXISTS,
                         f"{target} serves volume {old['volume_id']}")
                try:
                    pid = _publish(request, cmd)
                except PcrfsError as e:
                    fail(context, grpc.StatusCode.INTERNAL, f"volume {request.volume_id}: {e}")
                table[target] = {"volume_id": request.volume_id, "pid": pid}
                published.save(table)
            log.info("published %s at %s (daemon %d)", request.volume_id, target, pid)
            return pb.NodePublishVolumeResponse()

        def NodeUnpublishVolume(self, request, context):  # noqa: N802
            target = request.target_path
            if not request.volume_id or not target:
                fail(context, grpc.StatusCode.INVALID_ARGUMENT, "volume_id and target_path are required")
            with published.lock:
                table = published.load()
                entry = table.pop(target, None)
                _unpublish(target, entry["pid"] if entry else None)
                published.save(table)
            log.info("unpublished %s from %s", request.volume_id, target)
            return pb.NodeUnpublishVolumeResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pbg.add_IdentityServicer_to_server(Identity(), server)
    pbg.add_NodeServicer_to_server(Node(), server)
    if not endpoint.startswith("unix://"):
        raise PcrfsError(f"--endpoint {endpoint}: expected unix:///path/csi.sock")
    sock = endpoint[len("unix://"):]
    if os.path.exists(sock):
        os.unlink(sock)            # a previous plugin's socket
    os.makedirs(os.path.dirname(sock) or ".", exist_ok=True)
    if server.add_insecure_port(f"unix:{sock}") == 0:
        raise PcrfsError(f"--endpoint {endpoint}: cannot listen there")
    server.start()
    return server


def _pcrfs_script() -> str:
    """The `pcrfs` of this installation (beside this Python), else the one on PATH."""
    import shutil
    found = shutil.which("pcrfs", path=os.path.dirname(sys.executable)) or shutil.which("pcrfs")
    if not found:
        raise PcrfsError("the pcrfs command is not installed beside this Python or on PATH")
    return found


def _publish(request, cmd: list[str]) -> int:
    """mount(2) a /dev/fuse descriptor at the target, then start the daemon on it; its pid.
    On failure nothing is left mounted."""
    ctx = dict(request.volume_context)
    source = ctx.get("source") or request.volume_id
    target = request.target_path
    os.makedirs(target, exist_ok=True)
    fd = fuse_mount(target, {"allow_other", *(["ro"] if request.readonly else [])})
    try:
        args = [*cmd, "mount", source, f"/dev/fd/{fd}"]
        for key, flag in FLAGS.items():
            if ctx.get(key):
                args += [flag, ctx[key]]
        options = [o for o in ctx.get("options", "").split(",") if o]
        options += list(request.volume_capability.mount.mount_flags)
        if options:
            args += ["-o", ",".join(options)]
        env = {k: os.environ[k] for k in ("PATH", "HOME", "XDG_CACHE_HOME") if k in os.environ}
        env.update(request.secrets)      # cloud credentials: the daemon's environment only
        os.set_inheritable(fd, True)
        p = subprocess.run(args, pass_fds=(fd,), env=env, capture_output=True, text=True,
                           timeout=600, cwd="/")
        if p.returncode != 0:
            raise PcrfsError((p.stderr.strip().splitlines() or ["pcrfs mount failed"])[-1])
        with open(os.path.join(target, ".pcrfs", "stats.json")) as f:
            return int(json.load(f)["pid"])
    except BaseException:
        unmount(target, lazy=True)
        raise
    finally:
        os.close(fd)


def _unpublish(target: str, pid: int | None) -> None:
    """Unmount (lazily: open files of a terminating pod must not block it), stop the
    daemon, remove the target directory.  Idempotent."""
    if is_mounted(target) and (err := unmount(target, lazy=True)) != 0:
        raise PcrfsError(f"umount {target}: {os.strerror(err)}")
    if pid:
        try:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT
            while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
                time.sleep(0.05)
            if os.path.exists(f"/proc/{pid}"):
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.rmdir(target)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("%s left in place: %s", target, e.strerror)


def serve(endpoint: str, node_id: str, state_dir: str) -> int:
    server = make_server(node_id, endpoint, state_dir)
    log.info("CSI node plugin %s for node %s on %s", NAME, node_id, endpoint)
    stop = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: stop.set())
    stop.wait()
    server.stop(grace=5).wait()
    return 0
