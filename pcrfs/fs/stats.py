"""stats.json as a mount serves it: the dataset's counters (telemetry/stats.py) with the
fast lane's added (it answers requests Python never sees), per view, cache tier and memory
budget share, and the supervisor's session.  Read on the trio loop, at each read of
.pcrfs/stats.json and each metrics scrape (through fs/loop.py's snapshots)."""
from __future__ import annotations

from pcrfs.fs import kernel_shim


def mount_stats(ops) -> dict:
    """ops: the mount's PcrfsOperations (fs/operations.py)."""
    s = ops.stats.snapshot()
    lane = kernel_shim.counts()
    req = s.setdefault("requests", {})
    for op, n in (("open", lane["open"]), ("ioctl", lane["ioctl"]),
                  ("lookup", lane["cold_lookup"])):
        if n:
            req[op] = req.get(op, 0) + n
    cold: dict[str, dict[str, int]] = {}
    s["fast_lane"] = {"running": kernel_shim.running(), "realtime": kernel_shim.realtime(),
                      "niced": kernel_shim.niced(),
                      "threads": kernel_shim.threads(), **lane, "cold": cold,
                      "segment_table_bytes": kernel_shim.table_bytes(),
                      "segment_table": kernel_shim.table_source(),
                      "cold_views": sorted(v.name for t, v in ops.root.trees.items()
                                           if kernel_shim.serves(t)),
                      # where cold reads come from: the records, or the disk tier
                      "segment_source": ("disk" if kernel_shim.from_disk_tier() else
                                         "records" if kernel_shim.table_source() else None),
                      "lookup_names": kernel_shim.names_in_place()}
    served = kernel_shim.served()     # READs the lane answered from its store
    disk = kernel_shim.from_disk_tier()
    tiers = ops.ds.cache_tiers()
    for tree, c in kernel_shim.cold().items():   # ... and cold, from the records
        if tree in ops.root.trees:
            view = ops.root.trees[tree]
            cold[view.name] = c
            b, f = served.get(tree, (0, 0))
            served[tree] = (b + c["bytes"], f + c["files"])
            for key, n in view.lane_counts(c, disk).items():   # as Python counts
                s[key] = s.get(key, 0) + n
    if disk and "disk" in tiers:      # (Python counts a hit per entry it reads)
        s["disk_cache_hits"] = s.get("disk_cache_hits", 0) + lane["disk_images_read"]
        tiers["disk"]["hits"] += lane["disk_images_read"]
        tiers["disk"]["bytes_read"] += sum(c["read_bytes"] for c in cold.values())
    for tree, (nbytes, files) in served.items():
        if tree in ops.root.trees:
            view = ops.root.trees[tree].name
            for key, n in (("served_bytes", nbytes), ("served_files", files)):
                s.setdefault(key, {})[view] = s.get(key, {}).get(view, 0) + n
    s["open_files"] = (len(ops._files) + ops.inode_opens + ops.alias_opens
                       + lane["open"] - lane["release"])
    s["restarts"] = ops.session.get("restarts", 0)
    s["upgrades"] = ops.session.get("upgrades", 0)
    if ops.session:
        s["supervisor"] = {"pid": ops.session["supervisor_pid"],
                           "recovered_inodes": getattr(ops.recovery, "recovered", 0),
                           "resend": ops.session["resend"],
                           "fuse_protocol": ops.session["fuse_protocol"]}
    s["known_inodes"] = len(ops.inodes)
    s["cache_tiers"] = tiers
    if ops.ds.node is not None:
        s["shard"] = ops.ds.node.status()
    fills = ops.ds.reader.fill_quota
    s["memory_budget"] = ops.ds.budget.as_dict() | {
        "open_files_bytes": ops._held.used, "record_fills_bytes": fills.used,
        "record_fills_peak_bytes": fills.peak}
    s["cache_bytes"] = ops.ds.reader.cache.used
    s["cache_capacity"] = ops.ds.reader.cache.capacity
    t = ops.ds.throttle
    s["bandwidth_limit_bytes_per_s"] = int(t.rate) if t else None
    fds = getattr(ops.ds.storage, "fds", None)      # a local dataset's record files
    if fds is not None:
        s["record_files"] = {"open": fds.open_count(), "capacity": fds.capacity,
                             "opens": fds.opens, "evictions": fds.evictions,
                             "sheds": fds.sheds}
    disk = getattr(ops.ds.storage, "disk", None)    # a remote dataset's extent cache
    if disk is not None:
        s["disk_cache_bytes"], s["disk_cache_capacity"] = disk.used, disk.capacity
        s["disk_cache_discarded"] = disk.discarded
    s["source"] = ops.ds.url or ops.ds.root
    for v in ops.root.trees.values():
        s.update(v.stats())
    s["readdir_entries"] = dict(ops.entries_listed)
    s.update(ops.metrics_info)
    s["readdirplus"] = ops.listing.mode
    return s
