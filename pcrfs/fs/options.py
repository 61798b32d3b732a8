"""Mount options (`-o name=value,...`): one table (OPTIONS) that parses, validates and
documents each, the FUSE options passed through, and what the kernel is told."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from pcrfs.errors import PcrfsError
from pcrfs.fs.listing import MODES
from pcrfs.storage.cache import POLICIES

# FUSE / kernel options passed through to libfuse.
PASS_THROUGH = {"allow_other", "allow_root", "default_permissions", "ro", "nosuid", "suid",
                "nodev", "dev", "noexec", "exec", "noatime", "atime", "relatime",
                "sync", "async", "dirsync"}
# Options mount(8), fstab and systemd add that mean nothing to a FUSE daemon.
IGNORED = {"_netdev", "nofail", "noauto", "auto", "user", "users", "nouser", "owner",
           "defaults", "rw", "nonempty"}


@dataclass
class MountOptions:
    fuse: set[str] = field(default_factory=set)
    nonempty: bool = False
    ignored: list[str] = field(default_factory=list)
    fidelity: str | None = None     # initial fidelity of MNT/dynamic (default: qG)
    readdirplus: str = "auto"       # do listed files carry attributes (fs/listing.py)
    fast_lane: bool = True          # warm-epoch requests answered in C (fs/kernel_shim.py)
    lane_priority: str = "realtime"  # SCHED_FIFO for the first lane thread, all, or none
    lane_nice: int = 0              # nice value of the lane threads not at SCHED_FIFO (0: as is)
    lane_threads: int = 0           # lane threads (0: default_lane_threads)
    lane_cold: bool = True          # cold q-view reads of local records answered in C
    lane_lookup: bool = True        # ... and LOOKUP of their names (segtab.Names)
    skip_open: bool = False         # no OPEN/RELEASE round trips (fs/kernel_shim.py)
    default_permissions: bool = True  # kernel checks modes; off only if asked explicitly
    cache_policy: str = "lru"       # admission/eviction of the cache tiers (storage/cache.py)
    fetch: str = "image"            # a remote random reader's fetch: its segments, or the record's
    metrics: tuple[str, int] | None = None    # Prometheus endpoint (pcrfs/telemetry/metrics.py)
    metrics_textfile: str | None = None       # ... or a file for node-exporter
    metrics_labels: dict[str, str] = field(default_factory=dict)
    metrics_interval: float = 15.0            # textfile rewrites
    mix: float | None = None        # raw share of MNT/mix (pcrfs/liquid/rules.py)
    mix_fidelity: int | None = None
    seq: tuple[int, ...] | None = None   # the b_k views served (None: liquid.json's)
    hold: int = 0                   # bytes of mix/raw files held in memory (static)
    supervise: bool | None = None   # a supervisor holds the mount across daemons (None:
                                    # wherever it can hold the descriptor, fs/mount.py)
    restart_limit: int = 5          # ... and gives up after this many failures in a row


def _split_options(value: str) -> list[str]:
    """Comma-separated options; NAME=VALUE items right after metrics_labels= are more
    labels (so -o metrics_labels=team=vision,job=r50 reads as the user meant)."""
    out: list[str] = []
    for opt in filter(None, (o.strip() for o in value.split(","))):
        name = opt.split("=", 1)[0]
        if out and out[-1].startswith("metrics_labels=") and "=" in opt \
                and name not in OPTIONS:
            out[-1] += ";" + opt
        else:
            out.append(opt)
    return out


# -- pcrfs's own -o options: one row each (name -> parser, usage, value when bare) -----
class _Expected(ValueError):
    """A value outside the option's form: the message says NAME=<this>."""


def _choice(*values: str):
    def parse(v: str) -> str:
        if v not in values:
            raise _Expected(", ".join(values[:-1]) + " or " + values[-1])
        return v
    return parse


def _yes_no(v: str) -> bool:
    return _choice("yes", "no")(v) == "yes"


def _int_in(lo: int, hi: int):
    def parse(v: str) -> int:
        try:
            n = int(v)
        except ValueError:
            n = lo - 1
        if not lo <= n <= hi:
            raise _Expected(f"N, {lo} to {hi}")
        return n
    return parse


def _seconds(v: str) -> float:
    try:
        x = float(v)
    except ValueError:
        x = 0.0
    if not x > 0:
        raise ValueError("expected a positive number of seconds")
    return x


def _path(v: str) -> str:
    if not v:
        raise ValueError("no path")
    return v


def _metrics_address(v: str):
    from pcrfs.telemetry import metrics
    return metrics.parse_address(v)


def _share(v: str) -> float:
    from pcrfs.liquid.rules import parse_share
    return parse_share(v, f"-o mix={v}")


def _fidelity_k(v: str) -> int:
    from pcrfs.views.control import parse_fidelity
    return parse_fidelity(v, 255)


def _seq(v: str) -> tuple[int, ...]:
    """K:K:...: the b_k views to serve; all (every k) or none."""
    if v in ("all", "none"):
        return (0,) if v == "all" else ()
    return tuple(sorted({_fidelity_k(k) for k in v.split(":")}))


def _size(v: str) -> int:
    from pcrfs.storage.throttle import parse_size
    return parse_size(v)


@dataclass(frozen=True)
class Option:
    parse: object                   # value -> MountOptions field (ValueError: why not)
    usage: str                      # as the help and the errors spell it
    help: str                       # docs/OPTIONS.md and `pcrfs mount --help`
    bare: object = None             # the value of the option given without "=VALUE"
    field: str = ""                 # MountOptions field, if not the option's name


OPTIONS: dict[str, Option] = {
    "fidelity": Option(str, "fidelity=K", "the initial fidelity of MNT/dynamic (default: qG)"),
    "readdirplus": Option(_choice(*MODES), "readdirplus=auto|yes|no",
                          "whether listed files carry attributes (default auto: bare until "
                          "a stat walk shows; docs/SEMANTICS.md, Listings)"),
    "fast_lane": Option(_yes_no, "fast_lane=yes|no",
                        "answer warm reads, opens and lookups in C (default yes)"),
    "lane_priority": Option(_choice("realtime", "all", "normal"),
                            "lane_priority=realtime|all|normal",
                            "SCHED_FIFO for the first lane thread, for all, or for none "
                            "(default realtime; needs root or CAP_SYS_NICE, else quietly none)"),
    "lane_nice": Option(_int_in(-20, 0), "lane_nice=N",
                        "nice value of the lane threads not at SCHED_FIFO (default 0: "
                        "unchanged)"),
    "lane_threads": Option(_int_in(1, 256), "lane_threads=N",
                           "lane threads (default a quarter of the cores, at least 2)"),
    "lane_cold": Option(_yes_no, "lane_cold=yes|no",
                        "cold q-view reads of local records answered in C (default yes)"),
    "lane_lookup": Option(_yes_no, "lane_lookup=yes|no",
                          "LOOKUP of those files' names answered in C (default yes)"),
    "skip_open": Option(_yes_no, "skip_open=yes|no",
                        "no OPEN/RELEASE round trips; the kernel mount becomes ro "
                        "(default no; needs the fast lane)"),
    "cache_policy": Option(_choice(*POLICIES), "cache_policy=lru|static",
                           "what the memory and disk tiers keep: an LRU, or a fixed pinned "
                           "subset (default lru)"),
    "fetch": Option(_choice("image", "record"), "fetch=image|record",
                    "a remote dataset's random reader fetches its image's segments, or its "
                    "record's whole extent in pieces (default image; docs/REMOTE.md)"),
    "metrics": Option(_metrics_address, "metrics=[HOST:]PORT",
                      "serve Prometheus metrics there (docs/METRICS.md)"),
    "metrics_textfile": Option(_path, "metrics_textfile=PATH",
                               "write the metrics to PATH for node-exporter's textfile "
                               "collector"),
    "metrics_labels": Option(None, "metrics_labels=K=V,...",     # accumulates: below
                             "labels added to every metric"),
    "metrics_interval": Option(_seconds, "metrics_interval=SECONDS",
                               "how often the textfile is rewritten (default 15)"),
    "mix": Option(_share, "mix=R", "MNT/mix's raw share, 0..1 (default: liquid.json's, "
                  "from `pcrfs tune`; docs/LIQUID.md)"),
    "mix_fidelity": Option(_fidelity_k, "mix_fidelity=K",
                           "the fidelity of MNT/mix's JPEG files (default: liquid.json's)"),
    "seq": Option(_seq, "seq=K[:K...]|all|none",
                  "serve MNT/bK, q_K re-coded as one baseline scan, for these k (default: "
                  "the k `pcrfs tune` chose one for, else none; docs/CPU.md)"),
    "hold": Option(_size, "hold=SIZE", "bytes of raw/ and mix/ files held in memory, "
                   "a static set (default 0)"),
    "supervise": Option(_yes_no, "supervise[=yes|no]",
                        "a supervisor holds the mount across daemons (default yes wherever "
                        "it can hold the descriptor: root, or a user with fusermount3)",
                        bare=True),
    "restart_limit": Option(_int_in(0, 1000), "restart_limit=N",
                            "daemon failures in a row before a supervised mount answers "
                            "EIO (default 5)"),
}
FLAGS = {"nonempty": "nonempty", "no_default_permissions": "default_permissions"}


# `pcrfs mount`'s dataset flags, which a CSI volume sets too, by the flag's camelCase name
# (cacheSize for --cache-size; csi/plugin.py): flag -> argparse keywords.  SHARD_FLAGS
# are the "many nodes, one bucket" group of the mount's help.
DATASET_FLAGS: dict[str, dict] = {
    "--cache-size": dict(
        default="1G", help="the memory budget for every image byte the daemon holds: the "
        "memory tier (record extents; pinned images under -o cache_policy=static), the fast "
        "lane's store, open files, pending disk writes (default 1G)"),
    "--bandwidth-limit": dict(
        default=None, metavar="RATE",
        help="token bucket on backend bytes, e.g. 50M (bytes/s) or 400Mbit"),
    "--cache-dir": dict(
        default=None, metavar="DIR",
        help="on-disk cache, kept across remounts: transcoded format-view files and, for a "
        "remote dataset, its index and fetched record extents ('none' disables; default "
        "$XDG_CACHE_HOME/pcrfs or ~/.cache/pcrfs)"),
    "--cache-dir-size": dict(default="4G", metavar="SIZE",
                             help="bound of each on-disk cache (default 4G)"),
    "--fidelity": dict(
        default=None, metavar="K",
        help="initial fidelity of MNT/dynamic (default: full, qG); same as -o fidelity=K"),
    "--shard": dict(
        default=None, metavar="I/P",
        help="this is node I of P: its disk cache keeps the records it owns, never evicted "
        "(pcrfs warm fills it); the samplers use the same rule"),
    "--shard-seed": dict(
        type=int, default=0, metavar="S",
        help="seed of the ownership rule (the same on every node and sampler)"),
    "--peers": dict(
        default=None, metavar="HOST:PORT,...|@FILE",
        help="memcached of node 0..P-1 in order: owned segments are published to this "
        "node's, other nodes' records are read from theirs before storage"),
    "--peer-bandwidth-limit": dict(
        default=None, metavar="RATE",
        help="token bucket on bytes received from peers (emulates the interconnect)"),
    "--peer-key": dict(
        default=None, metavar="FILE",
        help="a secret every node shares (at least 16 bytes, readable by its owner only): "
        "peer values carry a keyed BLAKE2b MAC, so a memcached anyone can write cannot "
        "forge segments (docs/SECURITY.md); without it peers are trusted"),
}
SHARD_FLAGS = ("--shard", "--shard-seed", "--peers", "--peer-bandwidth-limit", "--peer-key")


def attribute_name(flag: str) -> str:
    """A dataset flag's name as a CSI volume attribute: --cache-dir-size -> cacheDirSize."""
    first, *rest = flag.lstrip("-").split("-")
    return first + "".join(w.capitalize() for w in rest)


def parse_mount_options(values: list[str] | None) -> MountOptions:
    from pcrfs.telemetry import metrics
    mo = MountOptions()
    for value in values or []:
        for opt in _split_options(value):
            name, eq, arg = opt.partition("=")
            spec = OPTIONS.get(name)
            if opt in FLAGS:
                setattr(mo, FLAGS[opt], opt == "nonempty")
            elif spec is not None and (eq or spec.bare is not None):
                if name == "metrics_labels":
                    mo.metrics_labels.update(metrics.parse_labels(arg))
                    continue
                try:
                    parsed = spec.parse(arg) if eq else spec.bare
                except _Expected as e:
                    raise PcrfsError(f"-o {opt}: expected {name}={e}") from None
                except ValueError as e:
                    raise PcrfsError(f"-o {opt}: {e}") from None
                setattr(mo, spec.field or name, parsed)
            elif opt in PASS_THROUGH:
                mo.fuse.add(opt)
            elif opt in IGNORED or opt.startswith(("x-", "comment=")):
                mo.ignored.append(opt)
            else:
                known = PASS_THROUGH | set(FLAGS) | {o.usage for o in OPTIONS.values()}
                raise PcrfsError(f"unknown mount option {opt!r} (supported: "
                                 f"{', '.join(sorted(known))})")
    if mo.skip_open and not mo.fast_lane:
        raise PcrfsError("-o skip_open=yes needs the fast lane: it is the lane that tells "
                         "the kernel to stop sending OPEN (drop fast_lane=no)")
    return mo


def kernel_options(mo: MountOptions) -> set[str]:
    """The mount's kernel options.  Not "ro" unless asked: the daemon refuses every write
    itself (EROFS), and .pcrfs/control/dynamic_fidelity must stay writable.  Under
    skip_open no OPEN reaches the daemon to refuse an open for writing, and nothing is
    writable, so there the kernel refuses it."""
    options = set(mo.fuse) | ({"ro"} if mo.skip_open else set())
    if mo.default_permissions:
        options.add("default_permissions")
    else:
        options.discard("default_permissions")
    return options


def default_lane_threads(cores: int) -> int:
    """A quarter of the cores, at least 2 (never more than the cores).  Every clone of
    /dev/fuse waits on the kernel's one request queue, so more threads contend more: on 16
    cores, 4 threads served 16 readers 36,700-42,200 cold q10 files/s, 16 threads
    19,300-21,100 (measured, bench/results/dataplane_lane_threads.json)."""
    return min(cores, max(2, cores // 4))


def lane_threads(mo: MountOptions) -> int:
    if not mo.fast_lane:
        return 1
    return mo.lane_threads or default_lane_threads(os.cpu_count() or 1)


def options_markdown() -> str:
    """docs/OPTIONS.md, from the table above (tools/cli_doc.py writes it)."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|")     # a pipe inside a table cell
    rows = [f"| `{cell(o.usage)}` | {cell(o.help)} |" for o in OPTIONS.values()]
    return "\n".join([
        "# `pcrfs mount -o` options",
        "",
        "Generated from `pcrfs/fs/options.py` by `tools/cli_doc.py`; "
        "`tests/test_docs.py` keeps it current.",
        "",
        "| option | what it does |",
        "|---|---|",
        *rows,
        "| `nonempty` | mount over a non-empty directory |",
        "| `no_default_permissions` | do not let the kernel check modes (the daemon "
        "still refuses writes) |",
        "",
        "Passed to the kernel as they are: "
        + ", ".join(f"`{o}`" for o in sorted(PASS_THROUGH)) + ".",
        "",
        "Accepted and ignored (what mount(8), fstab and systemd add): "
        + ", ".join(f"`{o}`" for o in sorted(IGNORED - {"nonempty"}))
        + ", `x-*`, `comment=*`.",
        "",
    ])
