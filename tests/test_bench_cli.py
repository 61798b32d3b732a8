"""The benchmarks drive the real CLI, but `make bench` runs rarely and reuses datasets it
built earlier, so a renamed option would only fail on a fresh machine.  Every option the
bench scripts pass literally must be one the CLI's parser knows."""
import argparse
import ast
from pathlib import Path

from pcrfs.cli import parser

BENCH = Path(__file__).resolve().parent.parent / "bench"
# helpers that run one subcommand with the call's extra arguments
HELPERS = {"ensure_dataset": "build", "Mounted": "mount"}


def _subcommands() -> dict[str, set[str]]:
    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {name: set(p._option_string_actions) for name, p in sub.choices.items()}


def _calls(sources):
    """(file:line, subcommand, literal option strings) of every CLI call in the sources,
    (name, text) pairs."""
    for name, text in sources:
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
                continue
            lits = [a.value for a in node.args
                    if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if node.func.id == "pcrfs" and lits:
                cmd, rest = lits[0], lits[1:]
            elif node.func.id in HELPERS:
                cmd, rest = HELPERS[node.func.id], lits
            else:
                continue
            yield f"{name}:{node.lineno}", cmd, [s for s in rest if s.startswith("-")]


def _unknown(sources) -> tuple[int, list]:
    known = _subcommands()
    calls = list(_calls(sources))
    return len(calls), [(where, cmd, opt) for where, cmd, opts in calls for opt in opts
                        if cmd not in known or opt not in known[cmd]]


def test_bench_passes_only_options_the_cli_knows():
    count, bad = _unknown((p.name, p.read_text()) for p in sorted(BENCH.glob("*.py")))
    assert count >= 10          # the scan found the benches' calls
    assert bad == []


def test_the_scan_catches_a_renamed_option():
    src = ('ensure_dataset(src, dst, "--format-views", "l3")\n'
           'pcrfs("materialize", ds, "raw", "--fraction", "1.0", "-q")\n'
           'Mounted(ds, mnt, "--bandwidth-limit", "1M", "-o", "mix=0.5")\n'
           'pcrfs("mount", ds, mnt, "--no-such-flag")\n')
    count, bad = _unknown([("x.py", src)])
    assert count == 4
    assert bad == [("x.py:1", "build", "--format-views"), ("x.py:4", "mount", "--no-such-flag")]
