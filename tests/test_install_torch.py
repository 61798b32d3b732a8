"""tools/install-torch.sh, which `make setup` runs before the torch extra (issue 86): on a
machine without an NVIDIA driver it asks PyTorch's CPU index, and only that index, for
torch and torchvision; where that fails it leaves the venv as it was and says how to get
the CPU build.  Run against a fresh venv, never this one."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tools" / "install-torch.sh"


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(d)], check=True)
    return d / "bin" / "python"


def run(py, **env) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), str(py)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def installed(py) -> str:
    return subprocess.run([str(py), "-m", "pip", "list", "--format=freeze"],
                          capture_output=True, text=True, check=True).stdout.lower()


def test_an_unreachable_cpu_index_installs_nothing_and_says_how(venv, tmp_path):
    """The configured registries and PIP_FIND_LINKS hold torch too (here the CUDA build
    and a CPU torch without a matching torchvision): the CPU attempt must not take from
    them, or a torch the extra then counts as satisfied stays behind."""
    index = tmp_path / "empty-index"
    index.mkdir()
    r = run(venv, PCRFS_TORCH_BUILD="cpu", PCRFS_TORCH_CPU_INDEX=index.as_uri())
    assert r.returncode == 0, r.stderr
    assert f"could not be installed from {index.as_uri()}" in r.stderr
    assert "PCRFS_TORCH_CPU_INDEX=URL" in r.stderr
    assert "torch" not in installed(venv)


def test_cuda_or_a_driver_leaves_it_to_the_extra_and_a_bad_choice_is_refused(venv):
    r = run(venv, PCRFS_TORCH_BUILD="cuda", PCRFS_TORCH_CPU_INDEX="file:///nonexistent")
    assert r.returncode == 0 and r.stdout == r.stderr == ""
    assert "torch" not in installed(venv)
    r = run(venv, PCRFS_TORCH_BUILD="rocm")
    assert r.returncode == 2 and "auto, cpu or cuda" in r.stderr
