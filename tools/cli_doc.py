#!/usr/bin/env python3
"""docs/CLI.md from pcrfs's argparse parser and docs/OPTIONS.md from the mount option
table (pcrfs/fs/options.py); tests/test_docs.py keeps both current.
Usage: tools/cli_doc.py [DOCS_DIR]"""
import argparse
import os
import sys
from pathlib import Path

from pcrfs.cli import parser
from pcrfs.fs.options import options_markdown


def cli_markdown() -> str:
    os.environ["COLUMNS"] = "100"        # argparse wraps at the terminal's width
    p = parser()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    out = ["# `pcrfs` commands", "",
           "Generated from `pcrfs/cli.py`'s argparse parser by `tools/cli_doc.py`; "
           "`tests/test_docs.py` keeps it current. Mount options: [OPTIONS.md](OPTIONS.md).",
           "", "```", p.format_help().rstrip(), "```", ""]
    for name, cmd in sub.choices.items():
        out += [f"## pcrfs {name}", "", "```", cmd.format_help().rstrip(), "```", ""]
    return "\n".join(out)


def main() -> int:
    docs = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent.parent / "docs")
    (docs / "CLI.md").write_text(cli_markdown())
    (docs / "OPTIONS.md").write_text(options_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
