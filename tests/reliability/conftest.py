"""Reliability suite plumbing: every test records what it injected and what it saw, and
tools/reliability_report.py turns the last run into docs/RELIABILITY.md."""
import json
import os
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS = Path(os.environ.get("PCRFS_RELIABILITY_RESULTS", REPO / ".cache" / "reliability" / "results.jsonl"))
# make test: 20 s of load; make soak: PCRFS_SOAK_SECONDS=1800
LOAD_SECONDS = float(os.environ.get("PCRFS_SOAK_SECONDS", "20"))


@pytest.fixture(scope="session")
def _results_file():
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("")          # one file per run: the report describes the last run
    return RESULTS


@pytest.fixture
def record(_results_file, request):
    """record(**figures): append this test's figures to the run's results."""
    def write(**figures):
        row = {"test": request.node.name, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               **figures}
        with open(_results_file, "a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
    return write
