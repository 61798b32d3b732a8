"""`pcrfs status MNT`: a mount's .pcrfs/stats.json (pcrfs.control.read_stats) for humans."""
from __future__ import annotations

import os


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _duration(s: float) -> str:
    s = int(s)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return (f"{d}d " if d else "") + f"{h:02d}:{m:02d}:{s:02d}"


def _remote_lines(s: dict, served: int) -> list[str]:
    """A remote dataset: network traffic and the disk cache."""
    if "disk_cache_capacity" not in s:
        return []
    got = s.get("remote_bytes", 0)
    hits, misses = s.get("disk_cache_hits", 0), s.get("disk_cache_misses", 0)
    return [
        f"source      {s.get('source', '-')}",
        f"remote      {_bytes(got)} in {s.get('remote_requests', 0)} requests"
        + (f" ({got / served:.3f} of served)" if served else "")
        + f"; {s.get('remote_retries', 0)} retries, {s.get('remote_errors', 0)} failed",
        f"disk cache  {hits} hits, {misses} misses, {s.get('disk_cache_discarded', 0)} corrupt "
        f"entries discarded; {_bytes(s.get('disk_cache_bytes', 0))} of "
        f"{_bytes(s['disk_cache_capacity'])}",
    ]


def _tier_lines(tiers: dict, s: dict) -> list[str]:
    """Admission policy and counters of each cache tier (storage/cache.py)."""
    out = []
    for name, t in tiers.items():
        images = {"memory": "memory_image_hits", "disk": "disk_cache_image_hits"}.get(name)
        whole = f" ({s.get(images, 0)} whole images)" if images else ""
        out.append(f"{name + ' tier':11} {t['policy']}: {t['hits']} hits{whole}, "
                   f"{t['misses']} misses, {t['admitted']} admitted, {t['refused']} refused, "
                   f"{t['evicted']} evicted; {_bytes(t['bytes'])} of {_bytes(t['capacity'])}")
    return out


def _budget_line(b: dict) -> str:
    """--cache-size and its shares (storage/budget.py)."""
    parts = ", ".join(f"{k.replace('_', ' ')} {_bytes(v)}" for k, v in b.items()
                      if k not in ("total", "open_files_bytes"))
    return f"budget      {_bytes(b.get('total', 0))}: {parts}"


def _record_files(rf: dict | None) -> str:
    if not rf:
        return ""
    return (f"; record files open {rf['open']} of {rf['capacity']} "
            f"({rf['opens']} opens, {rf['evictions']} closed by the LRU)")


def _lane_line(lane: dict) -> str:
    if not lane.get("running"):
        return "fast lane   off (every request goes through Python)"
    rt = int(lane.get("realtime") or 0)
    prio = (f"SCHED_FIFO ({rt} of " if rt else "normal priority (") + \
        f"{lane.get('threads', 1)} lane threads)"
    cold = lane.get("cold") or {}
    cold_line = ("\ncold reads  " + ", ".join(
        f"{v} {c['files']} files ({_bytes(c['bytes'])})"
        + (f", {c['checksum_failures']} checksum failures" if c["checksum_failures"] else "")
        + (f", {c['handed_to_python']} to Python" if c["handed_to_python"] else "")
        for v, c in sorted(cold.items())) + " answered in C") if cold else ""
    return (f"fast lane   on ({prio}): {lane.get('open', 0)} opens, {lane.get('ioctl', 0)} ioctls, "
            f"{lane.get('release', 0)} releases, {lane.get('read', 0)} reads, "
            f"{lane.get('getattr', 0)} getattrs answered in C; "
            f"{lane.get('handed_to_python', 0)} requests handed to Python"
            + (f", {lane['refused_nomem']} refused for want of memory"
               if lane.get("refused_nomem") else "") + "\n"
            f"lane store  {lane.get('store_images', 0)} images, "
            f"{_bytes(lane.get('store_bytes', 0))} of {_bytes(lane.get('store_budget', 0))}"
            + cold_line + _table_line(lane))


def _table_line(lane: dict) -> str:
    """Where the lane's segment table came from, and its LOOKUPs by name."""
    source = lane.get("segment_table")
    if not source:
        return ""
    how = "mapped from index.segtab" if source == "file" else "derived from the index"
    names = (f"; {lane.get('cold_lookup', 0)} lookups answered by name"
             if lane.get("lookup_names") else "; lookups by Python")
    disk = (f"\n            from the disk tier: {lane.get('disk_images_read', 0)} files, "
            f"{lane.get('disk_images_missing', 0)} not held (to Python)"
            if lane.get("segment_source") == "disk" else "")
    return (f"\nsegments    table {how} ({_bytes(lane.get('segment_table_bytes', 0))})"
            + names + disk)


def format_status(mnt: str, s: dict) -> str:
    hits, misses = s.get("cache_hits", 0), s.get("cache_misses", 0)
    rate = f"{100 * hits / (hits + misses):.1f}%" if hits + misses else "-"
    served = s.get("served_bytes", {})
    files = s.get("served_files", {})
    total = sum(served.values())
    limit = s.get("bandwidth_limit_bytes_per_s")
    errors = s.get("errors", {})
    lines = [
        f"mount       {os.path.abspath(mnt)} (daemon pid {s.get('pid')})",
        f"uptime      {_duration(s.get('uptime_s', 0))}",
        f"served      {_bytes(total)} in {sum(files.values())} files; backend read "
        f"{_bytes(s.get('backend_bytes', 0))} in {s.get('backend_reads', 0)} reads"
        + (f" (amplification {s['backend_bytes'] / total:.3f})" if total else ""),
        f"cache       hit rate {rate} ({hits} hits, {misses} misses, "
        f"{s.get('extent_fetches', 0)} extent fetches); "
        f"{_bytes(s.get('cache_bytes', 0))} of {_bytes(s.get('cache_capacity', 0))}",
        *_tier_lines(s.get("cache_tiers") or {}, s),
        _budget_line(s.get("memory_budget") or {}),
        f"bandwidth   {'limited to ' + _bytes(limit) + '/s' if limit else 'no limit'}",
        *_remote_lines(s, total),
        f"dynamic     {s.get('dynamic_fidelity', '-')} ({s.get('fidelity_switches', 0)} switches)",
        "errors      " + (", ".join(f"{k} {v}" for k, v in sorted(errors.items())) or "none")
        + f"; checksum failures {s.get('checksum_failures', 0)}",
        f"open files  {s.get('open_files', 0)}; inodes known {s.get('known_inodes', 0)}"
        + _record_files(s.get("record_files")),
        _lane_line(s.get("fast_lane") or {}),
    ]
    if served:
        lines.append("per view    " + ", ".join(
            f"{v} {_bytes(b)} ({files.get(v, 0)} files)" for v, b in sorted(
                served.items(), key=lambda kv: (len(kv[0]), kv[0]))))
    return "\n".join(lines)
