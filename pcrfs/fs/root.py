"""The root of a mount: one top-level directory per view, each a tree of inodes.

Tree ids (the top byte of an inode, fs/inodes.py) are given in registration order with
the immutable views first, so the fast lane is handed one contiguous range of inodes it
may answer in C; the control tree keeps its fixed id."""
from __future__ import annotations

from pcrfs.control import BALANCE, WARM
from pcrfs.fs.inodes import CONTROL, TREE_SHIFT
from pcrfs.views.base import View


class Root:
    def __init__(self, views: list[View], control: View):
        ordered = [v for v in views if v.immutable] + [v for v in views if not v.immutable]
        if len({v.name for v in ordered} | {control.name}) != len(ordered) + 1:
            raise ValueError("two views share a name")
        if len(ordered) >= CONTROL:
            raise ValueError(f"at most {CONTROL - 1} views")
        self.trees: dict[int, View] = {i + 1: v for i, v in enumerate(ordered)}
        self.trees[CONTROL] = control
        self.ids = {v.name.encode(): t for t, v in self.trees.items()}
        immutable = sum(v.immutable for v in ordered)
        # [lo, hi) of the inodes whose files the fast lane may open and serve
        self.lane_inodes = (1 << TREE_SHIFT, (immutable + 1) << TREE_SHIFT)

    def view(self, tree: int) -> View:
        return self.trees[tree]

    def tree_of(self, view: View) -> int:
        return self.ids[view.name.encode()]

    def names(self) -> list[tuple[bytes, int]]:
        """(directory name, tree id) of the root's listed entries, in listing order (a view
        not listed is still looked up by name)."""
        return [(n, t) for n, t in self.ids.items() if self.trees[t].listed]


def compose(ds, fidelity: int | None, stats_snapshot) -> Root:
    """The mount's root: the dataset's views, dynamic/ over its q views (starting at
    `fidelity`, default full, as the paper does) and the .pcrfs/ control tree."""
    from pcrfs.views.control import ControlView
    from pcrfs.views.dynamic import DynamicView
    dynamic = DynamicView([ds.served[q] for q in ds.views], fidelity or ds.groups)
    from pcrfs.views.mix import BULK
    from pcrfs.views.mix import NAME as MIX
    mix = ds.served.get(MIX)
    bulk = {} if mix is None else {BULK: mix.bulk}
    controls = {} if ds.node is None else node_controls(ds)
    return Root([*ds.served.values(), dynamic],
                ControlView(ds.manifest, stats_snapshot, dynamic, bulk, controls))


def node_controls(ds) -> dict:
    """A --shard mount's control files, balance and warm (pcrfs/cluster/node.py)."""
    from pcrfs.views.control import parse_fidelity
    node = ds.node

    def warm_state() -> bytes:
        w = node.status()["warm"]
        return (f"{w['state']}" + (f" q{w['k']} {w['done']}/{w['records']}" if "k" in w else "")
                + "\n").encode()

    def warm(data: bytes) -> None:
        node.start_warm(parse_fidelity(data, ds.groups))

    return {BALANCE.encode(): (lambda: f"{node.balance}\n".encode(), node.set_balance),
            WARM.encode(): (warm_state, warm)}
