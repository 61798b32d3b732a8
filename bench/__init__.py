"""pcrfs's benchmarks (`make bench`; what each measures: bench/README.md).  A package of
its own, installed editable into .venv beside the test kit (testkit/) it shares with the
tests; never part of the pcrfs wheel.  Entry points: `pcrfs-bench` (bench/run.py) and
`python -m bench.<module>` for the ones a GPU host runs (bench/devkit_run.sh)."""
