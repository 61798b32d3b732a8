"""Views: what each top-level directory of a mount serves (views/base.py).

Built in: q1..qG (JPEG at fidelity k), b_k (q_k re-coded as a baseline JPEG; -o seq),
l3 (lossless L3), dynamic/ (the fidelity of the moment) and the .pcrfs/ control tree.  A
dataset's views come from `dataset_views`: the built-in ones, then those of every
installed `pcrfs.views` entry point, a callable taking the open Dataset and returning a
View or a list of them.  A new view is one module and
one registration."""
from __future__ import annotations

import logging
from collections.abc import Iterator
from importlib.metadata import entry_points

from pcrfs.control import DIR
from pcrfs.views.base import Entry, Listing, Opened, View
from pcrfs.views.qk import QView, parse_view

log = logging.getLogger("pcrfs.views")
ENTRY_POINTS = "pcrfs.views"
RESERVED = ("dynamic", DIR)   # the mount's own views (fs/root.py compose)

__all__ = ["Entry", "Listing", "Opened", "View", "QView", "parse_view", "dataset_views"]


def _builtin(ds) -> list[View]:
    from pcrfs.views.l3 import NAME as L3
    from pcrfs.views.l3 import L3View
    from pcrfs.views.seq import PREFIX, SeqView
    out: list[View] = [QView(ds, k) for k in range(1, ds.groups + 1)]
    listed = set(seq_views(ds))
    # every b_k reachable by name, while the mount's trees allow (fs/inodes.py: 253 in all;
    # a dataset of over a hundred scan groups gets the listed ones only)
    ks = range(1, ds.groups + 1) if 2 * ds.groups + 8 < 0xFE else sorted(listed)
    out.extend(SeqView(ds, k, ds.disk_cache(f"{PREFIX}{k}"), k in listed) for k in ks)
    if L3 in ds.index.meta.get("format_views", []):
        out.append(L3View(ds, ds.disk_cache(L3)))
    out.extend(liquid_views(ds))
    return out


def seq_views(ds) -> list[int]:
    """The k of each b_k view the root lists: the mount's -o seq, else the one `pcrfs tune`
    chose (its "seq" key), else none.  Listed only when asked for because a b_k file's size
    is known only once it is made: `du` over a b view makes every file of it."""
    from pcrfs.liquid.rules import read_tuned
    want = ds.mix_options.seq
    if want is None:
        k = (read_tuned(ds.root) or {}).get("seq")
        want = (int(k),) if k else ()
    if want == (0,):
        return list(range(1, ds.groups + 1))
    bad = [k for k in want if not 1 <= k <= ds.groups]
    if bad:
        raise ValueError(f"-o seq: no q{bad[0]} to re-code (views q1..q{ds.groups})")
    return list(want)


def liquid_views(ds) -> list[View]:
    """raw/ and mix/ (pcrfs/liquid/rules.py): the mix's share and fidelity come from the mount
    options, else from what `pcrfs tune` stored, else the materialized share at qG."""
    from pcrfs.liquid.rules import read_tuned
    from pcrfs.views.mix import MixView
    from pcrfs.views.raw import RawSource, RawView
    opts = ds.mix_options
    source = RawSource(ds, opts.hold)
    tuned = read_tuned(ds.root) or {}
    share = opts.share
    if share is None:
        share = float(tuned.get("share", source.materialized))
    k = opts.fidelity or int(tuned.get("fidelity", ds.groups))
    if not 1 <= k <= ds.groups:
        raise ValueError(f"mix fidelity {k} out of range 1..{ds.groups}")
    if source.hold is not None:
        ds.add_tier("hold", source.hold)
    direct = bool(opts.hold)     # Liquid bypasses the page cache: hits stay at hold/dataset
    return [RawView(ds, source, direct), MixView(ds, source, share, k, direct)]


def dataset_views(ds) -> Iterator[View]:
    """The views of an open dataset, built-in first; the caller adds each to ds.served as
    it comes, so a plugin finds the built-in views there.  A plugin that fails to load or
    clashes with a name already taken is left out with an error in the log: the mount
    still serves everything else."""
    yield from _builtin(ds)
    for ep in entry_points(group=ENTRY_POINTS):
        try:
            made = ep.load()(ds)
            made = list(made) if isinstance(made, (list, tuple)) else [made]
            for v in made:
                if not isinstance(v, View) or not v.name or "/" in v.name:
                    raise TypeError(f"{v!r} is not a View with a plain name")
        except Exception as e:  # noqa: BLE001 - a third party's code: any error
            log.error("view plugin %s (%s) not loaded: %s", ep.name, ep.value, e)
            continue
        for v in made:
            if v.name in ds.served or v.name in RESERVED:
                log.error("view plugin %s: the name %r is taken; view left out", ep.name, v.name)
            else:
                yield v
