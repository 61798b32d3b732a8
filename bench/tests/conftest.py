"""The bench's own checks (`make bench-check`) run against the installed pcrfs, as the
benchmarks do.  bench/ is a package, so pytest's default import mode would put the
repository root on sys.path, where the checkout's pcrfs/ (no compiled extensions) would
shadow it: hence --import-mode=importlib."""
import pytest


def pytest_configure(config):
    if config.getoption("importmode") != "importlib":
        raise pytest.UsageError("bench/tests: run with --import-mode=importlib (make bench-check)")
