"""Daemon restarts under load (`pcrfs-bench --only restart`): 32 reader threads read
random files of five views of a supervised mount (-o supervise) for 60 s while the serving
daemon is SIGKILLed 5 times, then `pcrfs upgrade` once.  Per event: the longest read that
was under way between the kill and the first read the new daemon answered ("stall"), and
the time until the new daemon serves.  Target: stall <= 2 s per kill, and no error.
-> bench/results/restart.{json,png}"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.common import ensure_dataset, ensure_imagenet_like, pcrfs, pyplot, write_result
from testkit.restart_load import ReadLoad

READERS, SECONDS, KILLS = 32, 60.0, 5
VIEWS = ["q10", "q5", "l3", "raw", "dynamic"]
TARGET_STALL_S = 2.0


def _stats(mnt: Path) -> dict:
    import json
    return json.loads((mnt / ".pcrfs" / "stats.json").read_text())


def _new_daemon(mnt: Path, old: int, timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = _stats(mnt)["pid"]       # waits in the kernel while no daemon serves
        if pid != old:
            return pid
        time.sleep(0.01)
    raise RuntimeError(f"no new daemon within {timeout} s")


def _event(load: ReadLoad, mnt: Path, act, what: str) -> dict:
    old = _stats(mnt)["pid"]
    t0 = time.monotonic()
    act(old)
    new = _new_daemon(mnt, old)
    serving = time.monotonic() - t0
    base = load.reads()
    deadline = time.monotonic() + 30
    while load.reads() < base + 100 and time.monotonic() < deadline:
        time.sleep(0.01)
    return {"event": what, "old_pid": old, "new_pid": new, "t": t0,
            "new_daemon_serving_s": round(serving, 3),
            "longest_stall_s": round(load.longest_after(t0, t0 + serving), 3)}


def run_all(work: Path, out: Path, images: int = 0, quick: bool = False) -> dict:
    src = ensure_imagenet_like(work, images or 2000)
    ds = ensure_dataset(src, work / f"restart-{images or 2000}.pcr", "--images-per-record", "64")
    mnt = work / "restart-mnt"
    mnt.mkdir(exist_ok=True)
    seconds, kills = (15.0, 2) if quick else (SECONDS, KILLS)
    pcrfs("mount", ds, mnt, "-o", "supervise", "--log", str(work / "restart.log"))
    events: list[dict] = []
    try:
        load = ReadLoad(mnt, ds, VIEWS, threads=READERS, per_view=200).start()
        t_start = time.monotonic()
        try:
            slot = seconds / (kills + 2)        # the kills, then the upgrade, evenly
            for k in range(kills):
                time.sleep(max(0.0, t_start + (k + 1) * slot - time.monotonic()))
                events.append(_event(load, mnt, lambda pid: os.kill(pid, signal.SIGKILL),
                                     "SIGKILL"))
            time.sleep(max(0.0, t_start + (kills + 1) * slot - time.monotonic()))
            events.append(_event(load, mnt, lambda _: subprocess.run(
                [sys.executable, "-m", "pcrfs.cli", "upgrade", str(mnt)], check=True,
                capture_output=True, cwd="/"), "upgrade"))
            time.sleep(max(0.0, t_start + seconds - time.monotonic()))
        finally:
            summary = load.stop()
        st = _stats(mnt)
        for e in events:
            e["at_s"] = round(e.pop("t") - t_start, 3)
    finally:
        pcrfs("umount", mnt)
    stalls = [e["longest_stall_s"] for e in events if e["event"] == "SIGKILL"]
    result = {"readers": READERS, "seconds": seconds, "views": VIEWS, "images": images or 2000,
              "events": events, **summary,
              "restarts": st["restarts"], "upgrades": st["upgrades"],
              "recovered_inodes": st["supervisor"]["recovered_inodes"],
              "longest_stall_per_kill_s": max(stalls),
              "target_stall_s": TARGET_STALL_S,
              "target_met": max(stalls) <= TARGET_STALL_S and summary["errors"] == 0
              and summary["mismatches"] == 0}
    out.mkdir(parents=True, exist_ok=True)
    write_result(out, "restart", result)
    _plot(out, load, events, t_start)
    return result


def _plot(out: Path, load: ReadLoad, events: list[dict], t0: float) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    xs = [t - t0 for t, _ in load.log]
    ax.scatter(xs, [d for _, d in load.log], s=1, alpha=0.3, label="read latency")
    for e in events:
        ax.axvline(e["at_s"], color="gray", linewidth=0.8)
        ax.text(e["at_s"], TARGET_STALL_S * 2.5, f"{e['event']}\n{e['longest_stall_s']:.2f} s",
                fontsize=7, ha="center", va="bottom")
    ax.set_yscale("log")
    ax.set_ylim(top=TARGET_STALL_S * 12)
    ax.set_xlabel("seconds")
    ax.set_ylabel("read latency (s)")
    ax.set_title("Reads across daemon kills and an upgrade (-o supervise)")
    ax.axhline(TARGET_STALL_S, color="red", linestyle="--", label="target stall")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out / "restart.png", dpi=120)
    plt.close(fig)


def summary(r: dict) -> str:
    lines = [f"restart: {r['readers']} readers, {r['seconds']:.0f} s, {r['reads']} reads, "
             f"{r['errors']} errors, {r['mismatches']} mismatches"]
    for e in r["events"]:
        lines.append(f"  {e['event']:8s} new daemon serving after {e['new_daemon_serving_s']:.2f} s, "
                     f"longest stall {e['longest_stall_s']:.2f} s")
    lines.append(f"  longest stall per kill {r['longest_stall_per_kill_s']:.2f} s "
                 f"(target <= {r['target_stall_s']} s): "
                 f"{'met' if r['target_met'] else 'MISSED'}")
    return "\n".join(lines)
