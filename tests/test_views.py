"""The View interface: a view of its own, registered through the `pcrfs.views` entry-point
group by an installed distribution, served through the kernel next to the built-in ones;
the root's tree ids and the fast lane's range follow each view's `immutable`."""
import errno
import json
import os

from conftest import raises_errno

TOY = '''
"""A toy view: one file per class, "<images> <bytes at q1>\\n" of that class."""
from pcrfs.views import Entry, Listing, View


class ClassCounts(View):
    name = "classes"

    def __init__(self, ds):
        self.files = {}
        for c in ds.classes:
            names = [n for n, d in ds.listdir(c) if not d]
            q1 = sum(ds.file_size(c + "/" + os.fsdecode(n), "q1") for n in names)
            self.files[c.encode() + b".txt"] = f"{len(names)} {q1}\\n".encode()
        self.order = sorted(self.files)

    def lookup(self, path):
        if path == b"":
            return Entry(True, 0, 0)
        data = self.files.get(path)
        return None if data is None else Entry(False, len(data), 1 + self.order.index(path))

    def list(self, path, sizes=False):
        if path != b"":
            raise FileNotFoundError(path)
        return Listing([(n, False) for n in self.order], [1 + i for i in range(len(self.order))],
                       {n: len(self.files[n]) for n in self.order} if sizes else None)

    def read(self, path):
        return self.files[path]

    def xattrs(self, path):
        return {b"user.toy.kind": b"class-count"}


def make(ds):
    return ClassCounts(ds)
'''


def _install_plugin(root):
    """A distribution on PYTHONPATH with a `pcrfs.views` entry point, as pip lays it out."""
    (root / "toyview").mkdir(parents=True)
    (root / "toyview" / "__init__.py").write_text("import os\n" + TOY)
    info = root / "toyview-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toyview\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[pcrfs.views]\nclasses = toyview:make\n")
    return root


def test_a_registered_view_is_served_through_the_kernel(small_src, tmp_path, mount, monkeypatch):
    from pcrfs.dataset import open_dataset

    from conftest import run_pcrfs
    run_pcrfs("build", small_src, tmp_path / "ds", "--images-per-record", 4, "-q")
    monkeypatch.setenv("PYTHONPATH", str(_install_plugin(tmp_path / "plugin")))
    m = mount(tmp_path / "ds")
    with open_dataset(str(tmp_path / "ds")) as ds:
        want = {}
        for c in ds.classes:
            names = [n for n, d in ds.listdir(c) if not d]
            q1 = sum(len(ds.read(c.encode() + b"/" + n, "q1")) for n in names)
            want[c + ".txt"] = f"{len(names)} {q1}\n"
        groups = ds.groups
    top = sorted(os.listdir(m.mnt))
    assert "classes" in top and "dynamic" in top and "q1" in top
    assert sorted(os.listdir(m.mnt / "classes")) == sorted(want)
    for name, text in want.items():
        p = m.mnt / "classes" / name
        assert p.read_text() == text
        assert p.stat().st_size == len(text)              # exact before any read
        assert os.getxattr(p, "user.toy.kind") == b"class-count"
    assert raises_errno(lambda: open(m.mnt / "classes" / name, "w"), errno.EROFS)
    # inode numbers: unique, and from the view's own tree
    inos = {(m.mnt / "classes" / n).stat().st_ino for n in want}
    assert len(inos) == len(want)
    assert len({i >> 56 for i in inos}) == 1
    # the built-in views still work beside it, dynamic/ included (its tree id moved)
    cls = sorted(want)[0][:-4]
    f = sorted(os.listdir(m.mnt / "dynamic" / cls))[0]
    assert (m.mnt / "dynamic" / cls / f).read_bytes() == (m.mnt / f"q{groups}" / cls / f).read_bytes()
    (m.mnt / ".pcrfs/control/dynamic_fidelity").write_text("q1\n")
    assert (m.mnt / "dynamic" / cls / f).read_bytes() == (m.mnt / "q1" / cls / f).read_bytes()
    # an immutable plugin view lies in the fast lane's range: its opens never reach Python
    opens = json.loads((m.mnt / ".pcrfs/stats.json").read_text())["fast_lane"]["open"]
    for name in want:
        (m.mnt / "classes" / name).read_bytes()
    after = json.loads((m.mnt / ".pcrfs/stats.json").read_text())["fast_lane"]["open"]
    assert after - opens >= len(want)


def test_a_broken_plugin_costs_only_itself(small_src, tmp_path, mount, monkeypatch):
    from conftest import run_pcrfs
    run_pcrfs("build", small_src, tmp_path / "ds", "--images-per-record", 4, "-q")
    root = _install_plugin(tmp_path / "plugin")
    (root / "toyview" / "__init__.py").write_text("def make(ds):\n    raise RuntimeError('boom')\n")
    monkeypatch.setenv("PYTHONPATH", str(root))
    log = tmp_path / "daemon.log"
    m = mount(tmp_path / "ds", "--log", str(log))
    assert "classes" not in os.listdir(m.mnt) and "q1" in os.listdir(m.mnt)
    assert "view plugin classes" in log.read_text() and "boom" in log.read_text()


def test_root_numbers_immutable_views_first():
    from pcrfs.fs.root import Root
    from pcrfs.views.base import View

    def view(name, immutable):
        return type("V", (View,), {"name": name, "immutable": immutable})()
    ctl = view(".pcrfs", False)
    r = Root([view("a", True), view("m", False), view("b", True)], ctl)
    assert [r.trees[t].name for t in (1, 2, 3)] == ["a", "b", "m"]
    lo, hi = r.lane_inodes
    assert (lo, hi) == (1 << 56, 3 << 56)          # a and b, never m or .pcrfs
    assert r.trees[0xFE] is ctl


def test_dataset_and_fs_layer_read_through_views(corpus_ds):
    from pcrfs.dataset import open_dataset
    from pcrfs.views import View
    with open_dataset(str(corpus_ds)) as ds:
        assert all(isinstance(v, View) for v in ds.served.values())
        assert [v for v in ds.served if ds.served[v].listed] == ds.all_views
        # b_k reached by name, listed only when asked for (-o seq, or tune's choice)
        assert {v for v in ds.served if not ds.served[v].listed} == {
            f"b{k}" for k in range(1, ds.groups + 1)}
        assert all(ds.served[v].immutable for v in ds.all_views)
