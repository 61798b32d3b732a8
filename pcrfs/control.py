"""The client side of a mount: every path into its .pcrfs/ directory, reading its
stats.json and manifest, and its control files (switch MNT/dynamic between fidelities
from Python or a shell without remounting; warm a --shard node).  Plain file I/O, so it
works from any process (a training script, a scheduler, another container sharing the
mount).  The daemon serves these names (views/control.py takes DIR from here)."""
from __future__ import annotations

import errno
import json
import os

from pcrfs.errors import PcrfsError

DIR = ".pcrfs"
STATS = "stats.json"
MANIFEST = "manifest.json"
MIX_TSV = "mix.tsv"                    # every mix/ file's format, hold membership, record
CONTROLS = "control"                   # the writable files' directory, under DIR
FIDELITY = f"{CONTROLS}/dynamic_fidelity"
WARM = f"{CONTROLS}/warm"              # a --shard mount's
BALANCE = f"{CONTROLS}/balance"        # a --shard mount's
CONTROL_FILE = os.path.join(DIR, FIDELITY)
WARM_CONTROL = os.path.join(DIR, WARM)
BALANCE_CONTROL = os.path.join(DIR, BALANCE)


def path(mnt: str | os.PathLike, *parts: str) -> str:
    """MNT/.pcrfs/<parts>."""
    return os.path.join(os.fspath(mnt), DIR, *parts)


def is_mount(d: str | os.PathLike) -> bool:
    """Whether d is the top of a pcrfs mount (its manifest is served there)."""
    return os.path.isfile(path(d, MANIFEST))


def stale_mount(mnt: str | os.PathLike) -> PcrfsError:
    """The error for a mount whose daemon is gone (ENOTCONN), which says what to do."""
    mnt = os.fspath(mnt)
    return PcrfsError(f"{mnt} is a stale mount (the daemon is gone: Transport endpoint is not "
                      f"connected); run `pcrfs umount {mnt}`, then mount again")


def read_stats(mnt: str | os.PathLike) -> dict:
    """The mount's .pcrfs/stats.json; PcrfsError naming what is wrong (not a mount, a
    daemon that is gone)."""
    mnt, where = os.fspath(mnt), path(mnt, STATS)
    try:
        with open(where) as f:
            return json.load(f)
    except FileNotFoundError:
        raise PcrfsError(f"{mnt} is not a pcrfs mount (no {DIR}/{STATS})") from None
    except OSError as e:
        if e.errno == errno.ENOTCONN:
            raise stale_mount(mnt) from None
        raise PcrfsError(f"{where}: {e.strerror}") from None


def read_manifest(mnt: str | os.PathLike) -> dict:
    """The dataset's manifest as the mount serves it."""
    try:
        with open(path(mnt, MANIFEST), "rb") as f:
            return json.load(f)
    except FileNotFoundError:
        raise PcrfsError(f"{os.fspath(mnt)} is not a pcrfs mount (no {DIR}/{MANIFEST})") from None


def _control(mnt: str | os.PathLike) -> str:
    path = os.path.join(os.fspath(mnt), CONTROL_FILE)
    if not os.path.exists(path):
        raise PcrfsError(f"{os.fspath(mnt)} is not a pcrfs mount with a dynamic view "
                         f"(no {CONTROL_FILE})")
    return path


def get_fidelity(mnt: str | os.PathLike) -> int:
    """The fidelity MNT/dynamic serves now (k of qk)."""
    with open(_control(mnt), "rb") as f:
        return int(f.read().strip().lstrip(b"q"))


def _write_control(path: str, value: str) -> None:
    """One write of a control file (the daemon applies it, or refuses it with EINVAL)."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, value.encode() + b"\n")
    finally:
        os.close(fd)


def _groups(mnt) -> int:
    """G, the dataset's scan groups, from the mount's copy of its manifest."""
    return int(read_manifest(mnt)["groups"])


def set_fidelity(mnt: str | os.PathLike, k: int | str) -> int:
    """Serve MNT/dynamic at fidelity k ('q5', '5' or 5) from the next open on.  Files
    already open keep their fidelity.  Returns k once the kernel's cached sizes are
    invalidated.  ValueError for a fidelity the dataset does not have."""
    value = f"q{k}" if isinstance(k, int) else str(k).strip()
    path = _control(mnt)
    if value == "full":        # qG, whatever G is: the manifest says
        value = f"q{_groups(mnt)}"
    try:
        _write_control(path, value)
    except OSError as e:
        if e.errno == errno.EINVAL:
            raise ValueError(f"{os.fspath(mnt)}: invalid fidelity {value!r}: this dataset has "
                             f"q1..q{_groups(mnt)} (or 1..{_groups(mnt)}, or full)") from None
        if e.errno in (errno.EACCES, errno.EPERM):
            raise PermissionError(e.errno, "only the mounting user or root may switch fidelity",
                                  path) from None
        if e.errno == errno.EROFS:
            raise PcrfsError(f"{os.fspath(mnt)} is mounted with -o ro: the dynamic fidelity "
                             f"is fixed (remount without ro)") from None
        raise
    return get_fidelity(mnt)



def warm(mnt: str | os.PathLike, k: int | str | None = None, progress: bool = True,
         timeout: float | None = None) -> dict:
    """Fetch this node's owned records at fidelity k (default: the full view) into its
    disk tier and peer cache, through the mount (`--shard`); waits for the daemon to
    finish, with a progress bar.  Returns the warm's report (stats.json "shard")."""
    import time

    from tqdm import tqdm
    mnt = os.fspath(mnt)
    path = os.path.join(mnt, WARM_CONTROL)
    if not os.path.exists(path):
        raise PcrfsError(f"{mnt} is not a pcrfs mount with --shard (no {WARM_CONTROL})")

    def shard() -> dict:
        return read_stats(mnt)["shard"]

    if k is None:
        k = int(read_manifest(mnt)["groups"])
    value = f"q{k}" if isinstance(k, int) else str(k).strip()
    try:
        _write_control(path, value)
    except OSError as e:
        if e.errno == errno.EINVAL:
            raise PcrfsError(f"{mnt}: cannot warm at {value!r} (a bad fidelity, or a warm "
                             f"is already running; see pcrfs status)") from None
        raise
    deadline = None if timeout is None else time.monotonic() + timeout
    state = shard()
    with tqdm(total=state["owned_records"], unit="record", disable=not progress,
              desc=f"warm {value}") as bar:
        while True:
            w = state["warm"]
            bar.update(w.get("done", 0) - bar.n)
            if w["state"] != "running":
                return state
            if deadline is not None and time.monotonic() > deadline:
                raise PcrfsError(f"{mnt}: warm still running after {timeout} s")
            time.sleep(0.1)        # a progress poll, not a wait for a result
            state = shard()
