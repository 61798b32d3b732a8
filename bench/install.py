"""What a new user's two commands cost: `make demo` and `.ci/run` (lint + `make test`), each
in its own fresh clone of HEAD, timed and measured on disk; README.md's setup paragraphs cite
install.json.  It runs the whole suite, so it is not part of a plain `pcrfs-bench`:
`pcrfs-bench --only install` (about 25 minutes on 2 cores)."""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import REPO, du, write_result

# pytest's last line, e.g. "524 passed, 3 warnings in 1058.21s (0:17:38)" (a failed run
# stops before it is read: .ci/run exits non-zero)
_SUMMARY = re.compile(r"(\d+) passed.* in ([\d.]+)s")


def _clone(base: Path, name: str) -> Path:
    dest = base / name
    subprocess.run(["git", "clone", "-q", str(REPO), str(dest)], check=True)
    return dest


def _run(cmd: list[str], cwd: Path, log: Path) -> tuple[float, str]:
    t0 = time.monotonic()
    with log.open("w") as f:
        proc = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT)
    wall = time.monotonic() - t0
    text = log.read_text(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed in {cwd} (log {log}):\n{text[-3000:]}")
    return wall, text


def _sizes(clone: Path) -> dict:
    return {"clone_bytes": du(clone), "venv_bytes": du(clone / ".venv"),
            "cache_bytes": du(clone / ".cache"), "corpus_bytes": du(clone / ".cache" / "corpus")}


def run_all(out: Path) -> dict:
    base = Path(tempfile.mkdtemp(prefix="pcrfs-install-"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True, check=True).stdout.strip()
    demo = _clone(base, "demo")
    demo_s, _ = _run(["make", "demo"], demo, base / "demo.log")
    res = {"commit": commit, "demo": {"wall_s": round(demo_s, 1), **_sizes(demo)}}
    ci = _clone(base, "ci")
    ci_s, text = _run([".ci/run"], ci, base / "ci.log")
    m = list(_SUMMARY.finditer(text))[-1]
    res["ci"] = {"wall_s": round(ci_s, 1), "passed": int(m[1]),
                 "suite_s": round(float(m[2]), 1), "setup_and_lint_s": round(ci_s - float(m[2]), 1),
                 **_sizes(ci)}
    shutil.rmtree(base)
    write_result(out, "install", res)
    return res


def summary(res: dict) -> str:
    d, c = res["demo"], res["ci"]
    return (f"install ({res['commit']}): make demo {d['wall_s']:.0f} s, {d['clone_bytes'] / 1e6:.0f} MB; "
            f".ci/run {c['wall_s'] / 60:.1f} min (suite {c['suite_s'] / 60:.1f} min, "
            f"{c['passed']} passed), {c['clone_bytes'] / 1e9:.1f} GB")
