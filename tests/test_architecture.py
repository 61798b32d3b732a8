"""docs/ARCHITECTURE.md stays true: its module list is the package's, and the FUSE layer
and the dataset hold no view-specific branch (a view is one module plus a registration)."""
import re
from pathlib import Path

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


def test_no_view_specific_branch_in_the_fs_layer_or_the_dataset():
    # names of the built-in views, as a branch on them would spell them
    pattern = re.compile(r"""["'](l3|dynamic|\.pcrfs|q\d+)["']|L3_VIEW|DYNAMIC\b|dynamic_tree|"""
                         r"""CONTROL_DIR|== ?L3|\.control\.""")
    for rel in ("pcrfs/fs/operations.py", "pcrfs/dataset.py"):
        text = (REPO / rel).read_text()
        hits = [ln for ln in text.splitlines() if pattern.search(ln)]
        assert not hits, f"{rel}: {hits}"


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
    r = subprocess.run([str(ruff), "check", "pcrfs", "tests", "bench", "tools"], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_bench_modules_are_not_shadowed_by_the_tests():
    """bench/ and tests/ both go on sys.path as top-level roots (bench modules import each
    other by bare name), so a bench module that shares a name with a tests/ module or
    package imports the wrong one only when the whole suite runs (bench/remote.py did)."""
    def names(root):
        return {p.stem for p in root.glob("*.py")} | {
            p.name for p in root.iterdir() if (p / "__init__.py").exists()}
    assert not names(REPO / "bench") & names(REPO / "tests")
