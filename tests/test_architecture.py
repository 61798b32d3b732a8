"""docs/ARCHITECTURE.md stays true: its module list is the package's, and the FUSE layer
and the dataset hold no view-specific branch (a view is one module plus a registration)."""
import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).parent.parent
DOC = (REPO / "docs" / "ARCHITECTURE.md").read_text()


def test_module_list_is_the_package():
    block = DOC.split("## Modules", 1)[1]
    listed = set(re.findall(r"^(pcrfs/\S+\.py)", block, re.M))
    actual = {str(p.relative_to(REPO)) for p in (REPO / "pcrfs").rglob("*.py")}
    assert listed and listed == actual, (
        f"missing from docs/ARCHITECTURE.md: {sorted(actual - listed)}; "
        f"listed but gone: {sorted(listed - actual)}")


def test_every_module_the_paths_name_exists():
    named = set(re.findall(r"\b((?:builder|fs|views|storage|format)/[a-z_<>]+\.py)", DOC))
    for rel in named - {"views/<view>.py"}:
        assert (REPO / "pcrfs" / rel).exists(), rel


def _view_classes() -> set[str]:
    """The view classes pcrfs/views/ defines (what an isinstance branch would name)."""
    return {node.name for p in (REPO / "pcrfs" / "views").glob("*.py")
            if p.name not in ("base.py", "tree.py")         # View, TreeView, FormatView
            for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, ast.ClassDef) and node.name.endswith("View")}


def test_no_view_specific_branch_in_the_fs_layer_or_the_dataset():
    """Every module of the FUSE layer and the dataset asks a view what it is (lane_kind,
    aliases, serves_as), never which one it is: a view is one module plus its
    registration in fs/root.py, the one place that names them."""
    names = r"(l3|dynamic|raw|mix|\.pcrfs|q\d+)"
    pattern = re.compile(
        rf"""(==|!=|\bin\b)\s*\(?b?["']{names}["']|\[b?["']{names}["']\]|\.get\(b?["']{names}["']"""
        rf"""|\.name\s*(==|!=|\bin\b)|L3_VIEW|DYNAMIC\b|dynamic_tree|CONTROL_DIR|"""
        rf"""\b({"|".join(sorted(_view_classes()))})\b""")
    files = sorted((REPO / "pcrfs" / "fs").glob("*.py")) + [REPO / "pcrfs" / "dataset.py"]
    checked = [p for p in files if p.name != "root.py"]
    assert len(checked) >= 15
    for path in checked:
        hits = [ln.strip() for ln in path.read_text().splitlines() if pattern.search(ln)]
        assert not hits, f"{path.relative_to(REPO)}: {hits}"


def test_importing_a_pcrfs_module_does_not_load_the_dataset_stack():
    """`import pcrfs.errors` (or the CLI's parser) loads no lmdb, numpy, PIL or C
    extension; `pcrfs.open_dataset` still works, loading them on first use."""
    import subprocess
    import sys
    code = ("import sys, pcrfs.errors; "
            "heavy = [m for m in ('lmdb', 'numpy', 'PIL', 'pcrfs._native', 'pcrfs.dataset') "
            "if m in sys.modules]; print(heavy); "
            "import pcrfs; assert callable(pcrfs.open_dataset); print('pcrfs.dataset' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd="/", check=True).stdout.split("\n")
    assert out[0] == "[]" and out[1] == "True", out


def test_the_tree_is_lint_clean():
    """`make lint`: ruff with pyproject.toml's rules over the product, tests, bench and
    tools (pinned in the test extra, so a fresh clone checks the same way)."""
    import subprocess
    import sys
    ruff = Path(sys.executable).with_name("ruff")
    r = subprocess.run([str(ruff), "check", "pcrfs", "tests", "testkit", "bench", "tools"], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_tests_and_bench_share_code_only_through_the_kit():
    """bench/ and testkit/ are packages (installed editable by the setup), so nothing puts
    their folders on sys.path, and tests/ reaches bench/ only through its entry points
    (`python -m bench.X`), never by importing it: what both need lives in testkit/."""
    edits, imports = [], []
    for root in ("bench", "testkit", "tests"):
        for path in sorted((REPO / root).rglob("*.py")):
            rel = path.relative_to(REPO)
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Attribute) and node.attr == "path"
                        and isinstance(node.value, ast.Name) and node.value.id == "sys"
                        and root != "tests"):
                    edits.append(f"{rel}:{node.lineno}")
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                if root == "tests" and any(n == "bench" or n.startswith("bench.") for n in names):
                    imports.append(f"{rel}:{node.lineno}")
    assert not edits, f"sys.path edits in bench/ or testkit/: {edits}"
    assert not imports, f"tests/ imports bench/: {imports}"


def _layers() -> list[tuple[int, str]]:
    """(layer, path) from docs/ARCHITECTURE.md's table; a path ending in / is a folder."""
    block = DOC.split("## Layers", 1)[1].split("\n## ", 1)[0]
    out = []
    for row in re.findall(r"^\| (\d+) \|[^|]*\|(.*)\|$", block, re.M):
        out += [(int(row[0]), p) for p in re.findall(r"`([^`]+)`", row[1])]
    return out


def _layer_of(module: str, layers) -> int | None:
    """The layer of a dotted module name: that of the table entry that covers it."""
    unit = _unit_of(module, layers)
    return None if unit is None else next(layer for layer, p in layers if p == unit)


def _imports(path: Path) -> set[str]:
    """Every pcrfs module a file imports, at any depth (lazy imports included)."""
    import ast
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "pcrfs"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "pcrfs":
            for a in node.names:    # `from pcrfs.x import y`: y may be a module of x
                sub = f"{node.module}.{a.name}"
                is_mod = (REPO / (sub.replace(".", "/") + ".py")).exists() or \
                    (REPO / sub.replace(".", "/")).is_dir() or a.name.startswith("_")
                out.add(sub if is_mod and a.name != "__version__" else node.module)
    return out


def test_every_module_has_a_layer_and_imports_only_downward():
    layers = _layers()
    assert layers, "docs/ARCHITECTURE.md has no layer table"
    wrong, unplaced = [], []
    for f in sorted((REPO / "pcrfs").rglob("*.py")):
        rel = f.relative_to(REPO)
        mod = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        mine = _layer_of(mod, layers)
        if mine is None:
            unplaced.append(str(rel))
            continue
        for dep in _imports(f):
            theirs = _layer_of(dep, layers)
            if theirs is None:
                unplaced.append(f"{rel} imports {dep}")
            elif theirs > mine:
                wrong.append(f"{rel} (layer {mine}) imports {dep} (layer {theirs})")
    assert not unplaced, f"not in docs/ARCHITECTURE.md's layer table: {unplaced}"
    assert not wrong, "imports that run up the layers:\n" + "\n".join(wrong)


def _unit_of(module: str, layers) -> str | None:
    """The layer table's entry (a folder, or a file placed apart) that covers a module."""
    path = module.replace(".", "/")
    best = None
    for _, p in layers:
        covers = (path + "/").startswith(p) if p.endswith("/") else \
            path in (p.removesuffix(".py"), p.removesuffix("/__init__.py"))
        if covers and (best is None or len(p) > len(best)):
            best = p
    return best


def _unit_imports() -> dict[str, set[str]]:
    """Table entry -> the other entries its modules import (lazy imports included)."""
    layers, out = _layers(), {}
    for f in sorted((REPO / "pcrfs").rglob("*.py")):
        mod = ".".join(f.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        mine = _unit_of(mod, layers)
        deps = {_unit_of(d, layers) for d in _imports(f)} - {mine, None}
        out.setdefault(mine, set()).update(deps)
    return out


def test_no_two_packages_import_each_other():
    """A layer may hold several packages; none may lean on another that leans back on it
    (builder/ and admin/ did, through admin/summary.py and builder/engine.py)."""
    deps = _unit_imports()
    both = sorted({tuple(sorted((a, b))) for a, ds in deps.items() for b in ds
                   if a in deps.get(b, set())})
    assert not both, f"packages importing each other: {both}"


def test_the_layer_check_catches_an_upward_import():
    layers = _layers()
    assert _layer_of("pcrfs.storage.reader", layers) < _layer_of("pcrfs.views.qk", layers)
    assert _layer_of("pcrfs.liquid.rules", layers) < _layer_of("pcrfs.views.mix", layers) \
        < _layer_of("pcrfs.liquid.tune", layers)
    assert _layer_of("pcrfs.cluster.node", layers) == _layer_of("pcrfs.dataset", layers)
    assert _layer_of("pcrfs.nothing_here", layers) is None


def test_only_the_client_module_spells_a_mounts_control_paths():
    """pcrfs/control.py names .pcrfs/ and its files; every other module asks it, the view
    that serves them (views/control.py) included."""
    spelled = re.compile(r"""["']\.pcrfs["'/]|["'](?:stats|manifest)\.json["']\s*\)|"""
                         r"""b["'](?:stats|manifest)\.json["']|b["']control["']|["']control/|"""
                         r"""b?["']mix\.tsv["']""")
    found = [f"{p.relative_to(REPO)}: {ln.strip()}" for p in (REPO / "pcrfs").rglob("*.py")
             if p.name != "control.py" or p.parent.name != "pcrfs"
             for ln in p.read_text().splitlines() if spelled.search(ln)]
    assert not found, found


def test_views_use_only_the_data_plane_and_never_assign_to_it():
    """A view gets the dataset as a views.base.DataPlane: what it reads of it (as `ds` or
    `self.ds`) is a member of that Protocol, and it sets no attribute on it."""
    import ast
    import typing

    from pcrfs.views.base import DataPlane
    members = set(typing.get_type_hints(DataPlane)) | {
        n for n in vars(DataPlane) if not n.startswith("_")}

    def is_ds(node) -> bool:
        return (isinstance(node, ast.Name) and node.id == "ds") or (
            isinstance(node, ast.Attribute) and node.attr == "ds"
            and isinstance(node.value, ast.Name) and node.value.id == "self")
    used, assigned = {}, []
    for p in sorted((REPO / "pcrfs" / "views").glob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Attribute) and is_ds(node.value):
                used.setdefault(node.attr, p.name)
                if isinstance(node.ctx, ast.Store):
                    assigned.append(f"{p.name}: ds.{node.attr} = ...")
    assert used, "the scan found no use of the dataset in pcrfs/views/"
    assert not assigned, assigned
    outside = {a: f for a, f in used.items() if a not in members}
    assert not outside, f"views use dataset members outside DataPlane: {outside}"


@pytest.mark.mounts
def test_the_mount_watch_sees_a_mount_of_this_run(request, tmp_path):
    """tests/mountwatch.py, which fails an unmarked test that mounts (so `make test-fast`
    mounts nothing), sees a mount under this run's basetemp while it is live."""
    import subprocess
    import time
    watch = request.config.mountwatch
    watch.take()
    d = tmp_path / "tmpfs"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(d)], check=True)
    try:
        seen, deadline = [], time.monotonic() + 10
        while str(d) not in seen and time.monotonic() < deadline:
            seen += watch.take()
            time.sleep(0.01)
    finally:
        subprocess.run(["umount", str(d)], check=True)
    assert str(d) in seen


# A file past these sizes has more than one job; name here the ones whose one job needs more.
MAX_LINES = {".py": 600, ".c": 900}
LONGER = {"pcrfs/cli.py": 640}   # the command line: every subcommand's arguments, their help,
                                 # and the dispatch (issue 87: the parser could move out)


def test_no_file_has_more_than_one_jobs_worth_of_lines():
    files = {str(p.relative_to(REPO)): p for p in
             [*(REPO / "pcrfs").rglob("*.py"), *(REPO / "csrc").rglob("*.c")]}
    over = {name: n for name, p in files.items()
            if (n := len(p.read_text().splitlines())) > LONGER.get(name, MAX_LINES[p.suffix])}
    assert not over, f"split these along their jobs (or name the one job in LONGER): {over}"
