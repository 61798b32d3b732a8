"""A bounded run of tests/reliability/index_fuzz.py (make fuzz runs it for FUZZ_SECONDS):
crafted manifests, index entries and names, every checksum valid, give a refusal or a
file's own EIO, never another exception, under a 3 GiB address-space limit."""
import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import run_pcrfs

HERE = Path(__file__).parent
EXAMPLES = int(os.environ.get("PCRFS_INDEX_FUZZ_EXAMPLES", "60"))


def test_crafted_datasets_are_refused_or_eio_never_a_crash(small_src, tmp_path, record):
    ds = tmp_path / "template"
    run_pcrfs("build", small_src, ds, "-q", "--images-per-record", "8")
    p = subprocess.run([sys.executable, str(HERE / "index_fuzz.py"), str(ds),
                        "--examples", str(EXAMPLES)], capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    record(examples=res["examples"], outcomes=res["outcomes"])
    # the bound is real work: most examples were written, and both outcomes occurred
    assert res["examples"] >= EXAMPLES // 2
    assert res["outcomes"].get("refused", 0) > 0 and res["outcomes"].get("opened", 0) > 0
