"""The CSI node plugin: kubelet asks it, over a unix socket, to publish a volume (a pcrfs
dataset) at a pod's target path and to unpublish it.

One mount serves a volume on a node, shared by every pod that publishes it (the pattern
of mountpoint-s3's v2 driver): the first publish runs `pcrfs mount SOURCE STAGING -o
supervise` under --state-dir.  Its supervisor (pcrfs/fs/supervisor.py) opens /dev/fuse,
mount(2)s it with `fd=N` and hands the descriptor to the serving daemon, which it restarts
if it dies.  Each pod's target path is a bind mount of that staging mount.  The daemon
runs with the volume's secrets as its environment (cloud credentials), never on a command
line or in a log.  Unpublishing unmounts the target (lazily, so a pod's open files never
block it); the last one unmounts the staging mount, which ends its supervisor and daemon.

A volume is a PersistentVolume with `csi.driver: csi.pcrfs.dev`.  Its volumeAttributes
(volume_context) say what to serve:
  source          the dataset: a directory on the node, or s3://, gs://, az://, http(s)://
                  (default: the volume handle itself)
  options         pcrfs mount -o options, comma-separated (e.g. "skip_open=yes")
  cacheSize, cacheDir, cacheDirSize, fidelity, bandwidthLimit, shard, shardSeed, peers,
  peerBandwidthLimit
                  --cache-size, --cache-dir, --cache-dir-size, --fidelity, --bandwidth-limit,
                  --shard, --shard-seed, --peers, --peer-bandwidth-limit
  (the cache policy and metrics are mount options: options "cache_policy=static,metrics=9567")
Only read access modes are accepted: pcrfs is read-only."""
from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent import futures

from pcrfs.control import read_stats
from pcrfs.csi.logs import LogRelay
from pcrfs.errors import PcrfsError
from pcrfs.fs.kmount import bind, is_mounted, unmount
from pcrfs.fs.options import DATASET_FLAGS, attribute_name

log = logging.getLogger("pcrfs.csi")
NAME = "csi.pcrfs.dev"
# volume attributes for `pcrfs mount`'s dataset flags: cacheSize for --cache-size, ...
FLAGS = {attribute_name(f): f for f in DATASET_FLAGS}
STOP_TIMEOUT = 30.0


def _pb():
    try:
        from pcrfs.csi import csi_pb2, csi_pb2_grpc
    except ImportError as e:
        raise PcrfsError(f"pcrfs csi needs grpcio and protobuf (pip install 'pcrfs[csi]'): {e}") from None
    return csi_pb2, csi_pb2_grpc


class Published:
    """What this node serves, kept in a state file so that a restarted plugin still
    unpublishes it: targets (path -> volume id, volume key) and volumes (key -> staging
    mount point, supervisor pid)."""

    def __init__(self, state_dir: str):
        os.makedirs(state_dir, exist_ok=True)
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, "published.json")
        self.lock = threading.Lock()

    def load(self) -> dict:
        try:
            with open(self.path) as f:
                table = json.load(f)
        except FileNotFoundError:
            table = {}
        table.setdefault("targets", {})
        table.setdefault("volumes", {})
        return table

    def save(self, table: dict) -> None:
        from pcrfs.format.manifest import write_json_atomic
        write_json_atomic(self.path, table)


def make_server(node_id: str, endpoint: str, state_dir: str, pcrfs_cmd: list[str] | None = None):
    """A started grpc.Server on `endpoint` (unix:///path) serving Identity and Node."""
    import grpc
    pb, pbg = _pb()
    published = Published(state_dir)
    cmd = pcrfs_cmd or [_pcrfs_script()]
    relay = LogRelay()
    for vol in published.load()["volumes"].values():    # a restarted plugin's volumes
        relay.follow(_log_of(vol["staging"]), vol["volume_id"], from_end=True)

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
            bad = _check_attributes(dict(request.volume_context)) or _check_secrets(request.secrets)
            if bad:
                fail(context, grpc.StatusCode.INVALID_ARGUMENT,
                     f"volume {request.volume_id}: {bad}")
            failed, stopping = None, None
            with published.lock:
                table = published.load()
                old = table["targets"].get(target)
                if old is not None and is_mounted(target):
                    if old["volume_id"] == request.volume_id:
                        return pb.NodePublishVolumeResponse()   # published already
                    fail(context, grpc.StatusCode.ALREADY_EXISTS,
                         f"{target} serves volume {old['volume_id']}")
                key = _volume_key(request)
                vol = table["volumes"].get(key)
                try:
                    if vol is None or not is_mounted(vol["staging"]):
                        vol = _start_volume(request, cmd, published.state_dir, key, relay)
                        table["volumes"][key] = vol
                    os.makedirs(target, exist_ok=True)
                    bind(vol["staging"], target, readonly=True)
                except Exception as e:    # any failure: nothing of this publish stays mounted
                    failed = str(e) if isinstance(e, PcrfsError) else f"{type(e).__name__}: {e}"
                    if not any(t["key"] == key for t in table["targets"].values()):
                        stopping = _unmount_volume(table["volumes"].pop(key, None))
                else:
                    table["targets"][target] = {"volume_id": request.volume_id, "key": key}
                published.save(table)
            if failed is not None:
                _reap_volume(stopping, relay)    # up to STOP_TIMEOUT, outside the lock
                fail(context, grpc.StatusCode.INTERNAL, f"volume {request.volume_id}: {failed}")
            log.info("published %s at %s (supervisor %d)", request.volume_id, target,
                     vol["supervisor"])
            return pb.NodePublishVolumeResponse()

        def NodeUnpublishVolume(self, request, context):  # noqa: N802
            target = request.target_path
            if not request.volume_id or not target:
                fail(context, grpc.StatusCode.INVALID_ARGUMENT, "volume_id and target_path are required")
            stopping = None
            with published.lock:
                table = published.load()
                entry = table["targets"].pop(target, None)
                _unpublish(target)
                if entry and not any(t["key"] == entry["key"]
                                     for t in table["targets"].values()):   # its last pod
                    stopping = _unmount_volume(table["volumes"].pop(entry["key"], None))
                published.save(table)
            _reap_volume(stopping, relay)      # up to STOP_TIMEOUT, outside the lock
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


ATTRIBUTES = ("source", "options", *FLAGS)


def _check_attributes(ctx: dict) -> str:
    """Why these volume attributes cannot be served ("" if they can), naming the one."""
    from pcrfs.fs.options import parse_mount_options
    from pcrfs.storage.throttle import parse_rate, parse_size
    for k in ctx:
        if k not in ATTRIBUTES:
            return f"unknown volume attribute {k!r} (known: {', '.join(ATTRIBUTES)})"
    from pcrfs.cluster.shard import parse_shard
    from pcrfs.storage.peers import parse_peers
    checks = {"cacheSize": parse_size, "cacheDirSize": parse_size, "bandwidthLimit": parse_rate,
              "peerBandwidthLimit": parse_rate, "peers": parse_peers,
              "shard": lambda v: parse_shard(v, int(ctx.get("shardSeed", "0") or 0)),
              "shardSeed": int}
    for k, parse in checks.items():
        if k in ctx:
            try:
                parse(ctx[k])
            except (ValueError, PcrfsError) as e:
                return f"volume attribute {k}={ctx[k]!r}: {e}"
    if "fidelity" in ctx and not ctx["fidelity"].removeprefix("q").isdigit():
        return f"volume attribute fidelity={ctx['fidelity']!r}: expected qK or K"
    try:
        mo = parse_mount_options([ctx.get("options", "")])
    except PcrfsError as e:
        return f"volume attribute options: {e}"
    if mo.supervise is False:
        return "volume attribute options: a CSI volume is always supervised (no supervise=no)"
    return ""


# the names a volume's Secret may set in the daemon's environment: cloud credentials and
# pcrfs's own settings, never the loader's or Python's (LD_PRELOAD, PYTHONPATH) in a
# daemon that runs as root
SECRET_NAME = re.compile(r"(AWS|AZURE|GOOGLE|GCS|PCRFS)_[A-Z0-9_]+")


def _check_secrets(secrets) -> str:
    """Why these secrets cannot be the daemon's environment ("" if they can)."""
    for k in secrets:
        if not SECRET_NAME.fullmatch(k):
            return (f"secret key {k!r} is not a credential the daemon takes (AWS_*, AZURE_*, "
                    f"GOOGLE_*, GCS_*, PCRFS_*)")
    return ""


def _volume_key(request) -> str:
    """One mount per volume and settings on this node."""
    import hashlib
    what = json.dumps([request.volume_id, sorted(request.volume_context.items())])
    return hashlib.sha256(what.encode()).hexdigest()[:16]


def _log_of(staging: str) -> str:
    return staging + ".log"


def _start_volume(request, cmd: list[str], state_dir: str, key: str, relay: LogRelay) -> dict:
    """The volume's supervised mount at a staging path; {staging, supervisor}.  On
    failure nothing is left mounted.  Its log goes to the plugin's stdout (relay)."""
    ctx = dict(request.volume_context)
    source = ctx.get("source") or request.volume_id
    staging = os.path.join(state_dir, "volumes", key)
    os.makedirs(staging, exist_ok=True)
    args = [*cmd, "mount", source, staging]
    for k, flag in FLAGS.items():
        if ctx.get(k):
            args += [flag, ctx[k]]
    options = ["supervise", "allow_other", *(o for o in ctx.get("options", "").split(",") if o)]
    options += list(request.volume_capability.mount.mount_flags)
    args += ["-o", ",".join(options), "--log", _log_of(staging)]
    relay.follow(_log_of(staging), request.volume_id)
    env = {k: os.environ[k] for k in ("PATH", "HOME", "XDG_CACHE_HOME") if k in os.environ}
    env.update(request.secrets)      # cloud credentials: the daemon's environment only
    try:
        p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600, cwd="/")
        if p.returncode != 0:
            raise PcrfsError((p.stderr.strip().splitlines() or ["pcrfs mount failed"])[-1])
        sup = read_stats(staging).get("supervisor", {}).get("pid")
        if not sup:
            raise PcrfsError("the mount runs without a supervisor")
    except BaseException:       # a timeout or anything after the mount: leave none behind
        if is_mounted(staging):
            unmount(staging, lazy=True)
        relay.forget(_log_of(staging))
        raise
    return {"volume_id": request.volume_id, "staging": staging, "supervisor": int(sup)}


def _unmount_volume(vol: dict | None) -> dict | None:
    """Unmount a volume's staging mount (lazily, so at once) and remove its directory,
    under the publish lock; its daemon and supervisor then exit: `_reap_volume`."""
    if vol is None:
        return None
    staging = vol["staging"]
    if is_mounted(staging) and (err := unmount(staging, lazy=True)) != 0:
        raise PcrfsError(f"umount {staging}: {os.strerror(err)}")
    try:
        os.rmdir(staging)
    except OSError:
        pass
    return vol


def _reap_volume(vol: dict | None, relay: LogRelay) -> None:
    """Wait for an unmounted volume's supervisor to exit, SIGKILL after STOP_TIMEOUT;
    outside the publish lock, which other pods' publishes wait on.  Its last log lines
    then go out."""
    pid = vol and vol.get("supervisor")
    if not pid:
        return
    try:
        _stop_volume(pid)
    finally:
        relay.forget(_log_of(vol["staging"]))


def _stop_volume(pid: int) -> None:
    deadline = time.monotonic() + STOP_TIMEOUT
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _alive(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _alive(pid: int) -> bool:
    try:   # a zombie (exited, not yet reaped) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _unpublish(target: str) -> None:
    """Unmount a pod's bind mount (lazily: open files of a terminating pod must not block
    it) and remove the target directory.  Idempotent."""
    if is_mounted(target) and (err := unmount(target, lazy=True)) != 0:
        raise PcrfsError(f"umount {target}: {os.strerror(err)}")
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
