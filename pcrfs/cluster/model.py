"""`pcrfs model`: the IBM paper's analytical model (equations 1-8, ../spec/IBM-NOTES.md)
with a PCR dataset's own numbers, and the capacity plan of docs/SCALE.md.

Units: images, bytes and seconds.  D is the epoch's bytes (images x bytes per image at
fidelity k); rates R (storage, aggregate), r_c (peer link, per node) are bytes/s; V and U
(training, pre-processing) are images/s per node.

- regular:            I/O = D / R
- distributed cache:  I/O = (1 - a) D / R + a D (p - 1) / p / (p r_c)
- locality-aware:     I/O = (1 - a) D / R + a beta D / R_b, R_b = p r_c ("peer") or R
- each loader's epoch cost = max(training N / (p V), I/O + N / (p U))
- beta = sqrt((1 - 1/p) / (2 pi L)) with L the node's share of a global batch
- a (alpha) = min(1, p x cache per node / D)"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
from dataclasses import asdict, dataclass, field

from pcrfs.errors import PcrfsError
from pcrfs.format import INDEX_DIR

LOADERS = ("regular", "distributed", "locality")


@dataclass
class Params:
    images: float                         # N
    bytes_per_image: list[float]          # mean bytes at q1..qG
    nodes: int = 16                       # p
    train_rate: float = 2000.0            # V, images/s per node
    storage_rate: float = 2e9             # R, bytes/s for the whole cluster
    peer_rate: float = 1.25e9             # r_c, bytes/s per node link
    preprocess_rate: float = 1e9          # U, images/s per node (default: not a bound)
    cache_per_node: float = 1e12          # bytes
    local_batch: int = 32                 # per rank
    ranks_per_node: int = 4
    fidelity: int = 0                     # k (0: full)
    balance: str = "peer"
    index_bytes_per_image: float = 0.0
    record_images: int = 1024
    source: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def k(self) -> int:
        return self.fidelity or len(self.bytes_per_image)


def beta(p: int, local: float) -> float:
    """The imbalance volume's closed form (median sum of deficits / global batch)."""
    return math.sqrt((1 - 1 / p) / (2 * math.pi * local)) if p > 1 else 0.0


def epoch(pr: Params, p: int | None = None, k: int | None = None) -> dict:
    """Per-epoch seconds of each loader, and the bytes each asks of storage and peers."""
    p = p or pr.nodes
    k = k or pr.k
    n = pr.images
    d = n * pr.bytes_per_image[k - 1]
    alpha = min(1.0, p * pr.cache_per_node / d) if d else 1.0
    b = beta(p, pr.local_batch * pr.ranks_per_node)
    train = n / (p * pr.train_rate)
    pre = n / (p * pr.preprocess_rate)
    peer_total = p * pr.peer_rate
    rb = peer_total if pr.balance == "peer" else pr.storage_rate
    io = {"regular": d / pr.storage_rate,
          "distributed": (1 - alpha) * d / pr.storage_rate
          + alpha * d * (p - 1) / p / peer_total,
          "locality": (1 - alpha) * d / pr.storage_rate + alpha * b * d / rb}
    storage = {"regular": d, "distributed": (1 - alpha) * d,
               "locality": (1 - alpha) * d + (alpha * b * d if pr.balance == "storage" else 0)}
    peer = {"regular": 0.0, "distributed": alpha * d * (p - 1) / p,
            "locality": alpha * b * d if pr.balance == "peer" else 0.0}
    out = {"nodes": p, "k": k, "epoch_bytes": d, "alpha": alpha, "beta": b,
           "training_s": train, "preprocess_s": pre}
    for name in LOADERS:
        out[name] = {"io_s": io[name], "cost_s": max(train, io[name] + pre),
                     "storage_bytes": storage[name], "peer_bytes": peer[name],
                     "bound": "I/O" if io[name] + pre > train else "training"}
    return out


def bottleneck_nodes(pr: Params, loader: str, limit: int = 1 << 20) -> int | None:
    """The fewest nodes at which loading, not training, sets the epoch time (None: not
    below `limit`)."""
    def io_bound(p):
        return epoch(pr, p)[loader]["bound"] == "I/O"
    prev, p = 0, 1
    while p <= limit:     # a geometric scan (alpha grows with p: not monotonic overall) ...
        if io_bound(p):
            lo, hi = prev + 1, p
            while lo < hi:    # ... then the first I/O-bound p after the last training-bound
                mid = (lo + hi) // 2
                if io_bound(mid):
                    hi = mid
                else:
                    lo = mid + 1
            return lo
        prev, p = p, max(p + 1, int(p * 1.05))
    return None


def from_dataset(path: str) -> dict:
    """Image count, mean bytes per image at each k, index bytes per image."""
    from pcrfs import open_dataset
    with open_dataset(path) as ds:
        s = ds.manifest["summary"]
        n = int(s["images"])
        per_k = [s["total_bytes"][f"q{k}"] / n for k in range(1, ds.groups + 1)]
        index = os.path.getsize(os.path.join(ds.root, INDEX_DIR, "data.mdb"))
        per_record = max(1, round(n / max(1, len(ds.index.records))))
    return {"images": n, "bytes_per_image": per_k, "index_bytes_per_image": index / n,
            "record_images": per_record}


def _h(x: float, unit: str = "B") -> str:
    for u, s in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= u:
            return f"{x / u:.3g} {s}{unit}"
    return f"{x:.3g} {unit}"


def _t(s: float) -> str:
    return f"{s / 3600:.2f} h" if s >= 3600 else f"{s:.1f} s"


def report(pr: Params, link: float | None = None) -> dict:
    e = epoch(pr)
    out = {"params": asdict(pr), "epoch": e,
           "bottleneck_nodes": {name: bottleneck_nodes(pr, name) for name in LOADERS},
           "cache_per_node_for_alpha_1": e["epoch_bytes"] / pr.nodes,
           "index_bytes": pr.index_bytes_per_image * pr.images,
           "warm_gets": math.ceil(pr.images / pr.record_images),
           "steady_storage_requests_per_s": {
               "regular": pr.nodes * pr.train_rate,     # a ranged GET per image
               "distributed": (1 - e["alpha"]) * pr.nodes * pr.train_rate,
               "locality": ((1 - e["alpha"]) + (e["alpha"] * e["beta"]
                            if pr.balance == "storage" else 0)) * pr.nodes * pr.train_rate}}
    per_k = []
    for k in range(1, len(pr.bytes_per_image) + 1):
        ek = epoch(pr, k=k)
        per_k.append({"k": k, "bytes_per_image": pr.bytes_per_image[k - 1],
                      "storage_bytes_per_s_regular": pr.nodes * pr.train_rate
                      * pr.bytes_per_image[k - 1],
                      "node_ingress_bytes_per_s_regular": pr.train_rate * pr.bytes_per_image[k - 1],
                      **{f"{name}_cost_s": ek[name]["cost_s"] for name in LOADERS}})
    out["per_k"] = per_k
    if link:
        fits = [r["k"] for r in per_k if r["node_ingress_bytes_per_s_regular"] <= link]
        out["link"] = link
        out["highest_k_within_link"] = max(fits) if fits else None
    return out


def markdown(rep: dict, command: str) -> str:
    pr, e = rep["params"], rep["epoch"]
    lines = [
        "# Capacity plan (generated by `pcrfs model`)", "",
        "Regenerate with:", "", "```", command, "```", "",
        "The IBM paper's model (equations 1-8; `pcrfs/cluster/model.py` states them) with bytes per "
        "image at each fidelity taken from a pcrfs dataset"
        + (f" ({pr['source']})" if pr["source"] else "") + ". It plans; it does not measure: "
        "the counted volumes of the 4-node simulation are in `bench/results/cluster.json`.", "",
        "## Inputs", "",
        "| parameter | value |", "|---|---|",
        f"| images N | {pr['images']:.3g} |",
        f"| nodes p | {pr['nodes']} |",
        f"| ranks per node, local batch | {pr['ranks_per_node']}, {pr['local_batch']} |",
        f"| training rate V per node | {pr['train_rate']:.4g} images/s |",
        f"| storage rate R (cluster) | {_h(pr['storage_rate'], 'B/s')} |",
        f"| peer link r_c per node | {_h(pr['peer_rate'], 'B/s')} |",
        f"| cache per node | {_h(pr['cache_per_node'])} |",
        f"| fidelity | q{e['k']} ({_h(pr['bytes_per_image'][e['k'] - 1])} per image) |",
        f"| balance traffic | {pr['balance']} |", "",
        "## Per epoch", "",
        f"Epoch bytes D = {_h(e['epoch_bytes'])}; alpha = {e['alpha']:.3f}; "
        f"beta = {e['beta']:.4f}; training alone takes {_t(e['training_s'])}.", "",
        "| loader | I/O time | epoch cost | bound by | storage bytes | peer bytes |",
        "|---|---|---|---|---|---|"]
    for name in LOADERS:
        x = e[name]
        lines.append(f"| {name} | {_t(x['io_s'])} | {_t(x['cost_s'])} | {x['bound']} | "
                     f"{_h(x['storage_bytes'])} | {_h(x['peer_bytes'])} |")
    bn = rep["bottleneck_nodes"]
    lines += ["", "## Where storage becomes the bottleneck", "",
              "The fewest nodes at which loading, not training, sets the epoch time:", ""]
    for name in LOADERS:
        lines.append(f"- {name}: " + (f"{bn[name]} nodes" if bn[name] else "not below 10^6 nodes"))
    req = rep["steady_storage_requests_per_s"]
    lines += ["", "## Storage, cache and index", "",
              f"- Disk cache per node for alpha = 1: {_h(rep['cache_per_node_for_alpha_1'])} "
              f"(D / p).",
              f"- `pcrfs warm` of the whole cluster: {rep['warm_gets']:,} ranged GETs "
              f"(one per record of {pr['record_images']} images), {_h(e['epoch_bytes'])}.",
              f"- Steady storage requests/s (a GET per image read from storage): regular "
              f"{req['regular']:,.0f}, distributed cache {req['distributed']:,.0f}, "
              f"locality-aware {req['locality']:,.0f}.",
              f"- Storage bytes/s of regular loading at full speed: "
              f"{_h(pr['nodes'] * pr['train_rate'] * pr['bytes_per_image'][e['k'] - 1], 'B/s')}.",
              f"- Index: {_h(rep['index_bytes'])} ({pr['index_bytes_per_image']:.0f} bytes per "
              f"image), copied to every node.", "",
              "## Fidelity against the link", "",
              "| k | bytes/image | node ingress, regular | cluster storage, regular | "
              "regular cost | locality cost |", "|---|---|---|---|---|---|"]
    for r in rep["per_k"]:
        lines.append(f"| q{r['k']} | {_h(r['bytes_per_image'])} | "
                     f"{_h(r['node_ingress_bytes_per_s_regular'], 'B/s')} | "
                     f"{_h(r['storage_bytes_per_s_regular'], 'B/s')} | "
                     f"{_t(r['regular_cost_s'])} | {_t(r['locality_cost_s'])} |")
    if "link" in rep:
        k = rep["highest_k_within_link"]
        lines += ["", f"With a {_h(rep['link'], 'B/s')} link per node, regular loading at full "
                  f"training speed fits up to " + (f"q{k}." if k else "no fidelity.")]
    return "\n".join(lines) + "\n"


def run(a) -> dict:
    base = {}
    if a.dst:
        base = from_dataset(a.dst)
        base["source"] = os.path.basename(os.path.normpath(a.dst))
    if a.bytes_per_image:
        base["bytes_per_image"] = [float(x) for x in a.bytes_per_image.split(",")]
    if "bytes_per_image" not in base:
        raise PcrfsError("pcrfs model needs a dataset (DST) or --bytes-per-image b1,...,bG")
    if a.full_bytes:        # the dataset's profile over k, scaled to this full size
        f = a.full_bytes / base["bytes_per_image"][-1]
        base["bytes_per_image"] = [round(b * f, 1) for b in base["bytes_per_image"]]
    for name in ("images", "index_bytes_per_image", "record_images", "source"):
        v = getattr(a, name, None)
        if v:
            base[name] = "" if v == "-" else v
    if "images" not in base:
        raise PcrfsError("pcrfs model needs --images without a dataset")
    if not 0 <= a.fidelity <= len(base["bytes_per_image"]):
        raise PcrfsError(f"--fidelity {a.fidelity}: the dataset has "
                         f"{len(base['bytes_per_image'])} groups")
    if a.nodes < 1 or a.local_batch < 1 or a.ranks_per_node < 1:
        raise PcrfsError("--nodes, --local-batch and --ranks-per-node must be positive")
    pr = Params(images=float(base["images"]), bytes_per_image=base["bytes_per_image"],
                nodes=a.nodes, train_rate=a.train_rate, storage_rate=a.storage_rate,
                peer_rate=a.peer_rate, preprocess_rate=a.preprocess_rate,
                cache_per_node=a.cache_per_node, local_batch=a.local_batch,
                ranks_per_node=a.ranks_per_node, fidelity=a.fidelity, balance=a.balance,
                index_bytes_per_image=float(base.get("index_bytes_per_image", 0)),
                record_images=int(base.get("record_images", 1024)),
                source=str(base.get("source", "")))
    return report(pr, a.link)


def command_line(a) -> str:
    """The command that regenerates a report without the dataset (its numbers inline)."""
    rep = run(a)
    pr = rep["params"]
    args = ["pcrfs", "model", "--images", f"{pr['images']:.0f}",
            "--bytes-per-image", ",".join(f"{b:g}" for b in pr["bytes_per_image"]),
            "--index-bytes-per-image", f"{pr['index_bytes_per_image']:.1f}",
            "--record-images", str(pr["record_images"]), "--source", pr["source"] or "-",
            "--nodes", str(pr["nodes"]), "--train-rate", f"{pr['train_rate']:g}",
            "--storage-rate", f"{pr['storage_rate']:.0f}", "--peer-rate", f"{pr['peer_rate']:.0f}",
            "--preprocess-rate", f"{pr['preprocess_rate']:g}",
            "--cache-per-node", f"{pr['cache_per_node']:.0f}",
            "--local-batch", str(pr["local_batch"]), "--ranks-per-node", str(pr["ranks_per_node"]),
            "--fidelity", str(pr["fidelity"]), "--balance", pr["balance"]]
    if a.link:
        args += ["--link", f"{a.link:.0f}"]
    return shlex.join(args)


def main(a) -> int:
    rep = run(a)
    if a.markdown:
        text = markdown(rep, command_line(a) + f" --markdown {a.markdown}")
        with open(a.markdown, "w") as f:
            f.write(text)
        print(f"wrote {a.markdown}")
    elif a.json:
        print(json.dumps(rep, indent=2))
    else:
        e = rep["epoch"]
        print(f"N={rep['params']['images']:.4g} images, p={e['nodes']}, q{e['k']}: "
              f"D={_h(e['epoch_bytes'])}, alpha={e['alpha']:.3f}, beta={e['beta']:.4f}, "
              f"training {_t(e['training_s'])}")
        print(f"{'loader':<12} {'I/O':>10} {'cost':>10} {'bound':>9} {'storage':>10} {'peer':>10}")
        for name in LOADERS:
            x = e[name]
            print(f"{name:<12} {_t(x['io_s']):>10} {_t(x['cost_s']):>10} {x['bound']:>9} "
                  f"{_h(x['storage_bytes']):>10} {_h(x['peer_bytes']):>10}")
        for name, p in rep["bottleneck_nodes"].items():
            print(f"storage bottleneck, {name}: " + (f"from {p} nodes" if p else "none below 10^6"))
        print(f"disk cache per node for alpha=1: {_h(rep['cache_per_node_for_alpha_1'])}")
        if "highest_k_within_link" in rep:
            print(f"highest fidelity within the link: q{rep['highest_k_within_link']}")
    return 0


def add_parser(sub) -> None:
    from pcrfs.storage.throttle import parse_rate, parse_size
    mo = sub.add_parser("model", help="the IBM paper's analytical model: per-epoch cost of "
                        "regular, distributed-cache and locality-aware loading")
    mo.add_argument("dst", nargs="?", help="a dataset for N, bytes per image at each k, "
                    "and index bytes per image")
    mo.add_argument("--images", type=float, default=None, help="N (default: the dataset's)")
    mo.add_argument("--bytes-per-image", default=None, metavar="B1,...,BG",
                    help="mean bytes of an image at q1..qG (default: the dataset's)")
    mo.add_argument("--full-bytes", type=float, default=None, metavar="B",
                    help="scale the dataset's bytes-per-k profile to B bytes at full fidelity")
    mo.add_argument("--index-bytes-per-image", type=float, default=None,
                    help="index bytes per image every node holds (default: the dataset's)")
    mo.add_argument("--record-images", type=int, default=None,
                    help="images per record, the unit a node owns (default: the dataset's)")
    mo.add_argument("--source", default=None, help=argparse.SUPPRESS)
    mo.add_argument("--nodes", type=int, default=16, help="nodes in the cluster (default 16)")
    mo.add_argument("--train-rate", type=float, default=2000.0, metavar="V",
                    help="images/s one node trains at (default 2000)")
    mo.add_argument("--storage-rate", type=parse_rate, default=parse_rate("2G"), metavar="R",
                    help="storage bytes/s for the whole cluster (default 2G)")
    mo.add_argument("--peer-rate", type=parse_rate, default=parse_rate("10Gbit"), metavar="RC",
                    help="peer link bytes/s per node (default 10Gbit)")
    mo.add_argument("--preprocess-rate", type=float, default=1e9, metavar="U",
                    help="images/s one node pre-processes (default: no bound)")
    mo.add_argument("--cache-per-node", type=parse_size, default=parse_size("1T"),
                    help="disk cache of each node (default 1T)")
    mo.add_argument("--local-batch", type=int, default=32,
                    help="images per rank per step (default 32)")
    mo.add_argument("--ranks-per-node", type=int, default=4,
                    help="training processes per node (default 4)")
    mo.add_argument("--fidelity", type=int, default=0, metavar="K", help="0: full")
    mo.add_argument("--balance", choices=("peer", "storage"), default="peer",
                    help="where a node reads records it does not own (default peer)")
    mo.add_argument("--link", type=parse_rate, default=None, metavar="RATE",
                    help="a node's link: the highest fidelity regular loading fits in it")
    mo.add_argument("--json", action="store_true", help="the model's result as JSON")
    mo.add_argument("--markdown", default=None, metavar="FILE", help="write the capacity plan")
    mo.set_defaults(func=main)

