"""`pcrfs tune`'s choice, repeated (issue 82): is it stable, and does it keep its word?

On the calibrated set, mounted locally (the CPU-bound regime), `pcrfs tune --dry-run` runs
RUNS times for each kind of transform a user trains with (imagenet: unmodified ImageFolder
with Pillow and torchvision's ImageNet transform; fused: FastImageFolder).  Each run's
pick (view, share, k), its end-to-end rate and the bytes the mount's disk caches grew by
are kept; the result says whether the
picks agree, the spread of the chosen rate across runs, whether the bytes stayed within
the bound the tuner printed, and, where the pick is more than 5% slower than another
finalist measured in the same run, says so."""
from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path

from bench.calibration import ensure_set, result_name
from bench.common import PCRFS, Mounted, du, ensure_dataset, write_result

RUNS = 3
TRANSFORMS = ("imagenet", "fused")      # the two kinds a job trains with


def _tune(mnt: Path, transform: str, sample: int, out: Path) -> dict:
    """One `pcrfs tune --dry-run` run, its choice read back from its table."""
    choice_file = out / f"tune-{transform}.json"
    code = (f"import json,sys; from pcrfs.liquid.tune import tune; "
            f"c = tune({str(mnt)!r}, transform={transform!r}, workers=2, sample={sample}, "
            f"store=False, log=lambda *a: None); "
            f"json.dump(c, open({str(choice_file)!r}, 'w'))")
    python = str(Path(PCRFS).with_name("python"))
    subprocess.run([python, "-c", code], check=True, capture_output=True, text=True, cwd="/")
    return json.loads(choice_file.read_text())


def run_all(work: Path, out: Path, images: int = 400, quick: bool = False,
            which: str = "imagenet") -> dict:
    src, about = ensure_set(work, max(images, 400), which)
    ds = ensure_dataset(src, work / f"tuner-{src.name}")
    cache = work / "tuner-cache"
    runs = 2 if quick else RUNS
    sample = 60 if quick else 100
    res = {"set": about, "runs": runs, "sample": sample, "transforms": {}}
    tmp = work / "tuner-tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    for transform in TRANSFORMS:
        picks = []
        for _ in range(runs):
            subprocess.run(["rm", "-rf", str(cache)], check=True)
            with Mounted(ds, work / "mnt-tuner", "--cache-dir", str(cache)):
                c = _tune(work / "mnt-tuner", transform, sample, tmp)
            finals = [p for p in c["probes"] if p.get("measured")]
            best_other = max((p["measured"] for p in finals
                              if (p["share"], p["fidelity"], p["coding"])
                              != (c["share"], c["fidelity"], "b" if c.get("seq") else "q")),
                             default=None)
            picks.append({"view": c.get("view"), "share": c["share"], "fidelity": c["fidelity"],
                          "seq": c.get("seq"), "images_per_s": c["measured_images_per_s"],
                          "best_other_finalist": best_other,
                          "slower_than_a_finalist_by_more_than_5pct":
                              bool(best_other and c["measured_images_per_s"] < 0.95 * best_other),
                          "wrote_bytes": du(cache), "writes": c.get("writes")})
        rates = [p["images_per_s"] for p in picks]
        keys = {(p["view"], p["share"], p["fidelity"], p["seq"]) for p in picks}
        res["transforms"][transform] = {
            "picks": picks, "stable": len(keys) == 1,
            "distinct_picks": sorted(map(str, keys)),
            "rate_spread": round((max(rates) - min(rates)) / statistics.median(rates), 3),
            "within_write_bound": all(p["wrote_bytes"] <= p["writes"]["bound"] for p in picks)}
    name = result_name("tuner", which)
    write_result(out, name, res)
    return res


def summary(res: dict) -> str:
    lines = [f"tuner: {res['runs']} runs per transform, sample {res['sample']}, "
             f"{res['set']['name']} set"]
    for t, r in res["transforms"].items():
        picks = ", ".join(f"{p['view']} (r={p['share']}, k={p['fidelity']}) "
                          f"{p['images_per_s']:.0f} img/s" for p in r["picks"])
        lines.append(f"  {t:9} stable {r['stable']}, spread {r['rate_spread']:.1%}: {picks}")
    return "\n".join(lines)
