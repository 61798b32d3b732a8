"""What the tests (tests/) and the benchmarks (bench/) share, imported as a package from
the repository root: the real servers they start and stop (servers.py), synthetic
datasets written without the build's encoder (synthetic.py), the reader load of the
restart tests and bench (restart_load.py) and the page-cache drop (pages.py).  Not part
of the product: the wheel ships pcrfs/ only."""
