"""docs/FORMAT.md must describe the bytes the code writes."""
import re
import struct
from pathlib import Path

from pcrfs.format import index, record

from conftest import run_pcrfs

DOC = (Path(__file__).parent.parent / "docs" / "FORMAT.md").read_text()


def test_fixed_header_table_matches_the_writer(small_src, tmp_path):
    run_pcrfs("build", small_src, tmp_path / "ds", "--images-per-record", 5, "-q")
    raw = (tmp_path / "ds" / "records" / "r000001.pcr").read_bytes()
    rows = re.findall(r"^\| (\d+) \| (\d+) \| (.+?) \|$", DOC, re.M)
    fields = {name.split(",")[0].strip(): (int(off), int(size)) for off, size, name in rows}
    def get(name):
        off, size = fields[name]
        return int.from_bytes(raw[off:off + size], "little")
    assert raw[:8] == b"PCRFSREC" and fields["magic `PCRFSREC`"] == (0, 8)
    assert get("format version (1)") == 1 and get("record number") == 1
    n, g = get("n"), get("Gr")
    assert n == 5 and g == 10
    assert get("H") == 64 + 8 * (g + 1) + 8 * n * g + 8 == get("metadata offset (= H)")
    assert record.FIXED.size == 64


def test_entry_size_formula():
    assert "19 + 12·S" in DOC and index.ENTRY.size == 19
    e = index.pack_entry(1, 2, 3, 4, 5, 3, 0, [10, 20], [0, 7], [1, 2])
    assert len(e) == 19 + 12 * 2
    assert index.unpack_entry(e).size_at(1) == 12 and index.unpack_entry(e).size_at(9) == 32
    assert struct.unpack_from("<I", e, 19)[0] == 10  # cumulative bytes column first


def test_l3_sidecar_table_matches_the_writer(small_src, tmp_path):
    from pcrfs.dataset import open_dataset
    run_pcrfs("build", small_src, tmp_path / "ds", "--images-per-record", 5, "-q")
    raw = (tmp_path / "ds" / "records" / "r000001.l3m").read_bytes()
    rows = dict((name, (int(off), int(size))) for off, size, name in
                re.findall(r"^\| (\d+) \| (\d+) \| (.+?) \|$", DOC, re.M))
    def get(name):
        off, size = rows[name]
        return raw[off:off + size]
    ds = open_dataset(str(tmp_path / "ds"))
    assert get("magic `PCRFSL3M`") == b"PCRFSL3M"
    assert int.from_bytes(get("number of the record it belongs to"), "little") == 1
    assert get("UUID of the dataset it belongs to") == ds.uuid.bytes
    n = int.from_bytes(get("count of images in that record"), "little")
    assert n == 5 and len(raw) == 32 + 12 * n + 8
    e = ds.lookup(ds.index.iter_images().__next__()[0])
    assert e.l3_size is not None and e.l3_size > 13


L3_DOC = (Path(__file__).parent.parent / "docs" / "L3.md").read_text()


def test_l3_doc_header_and_worked_example():
    import numpy as np

    import pcrfs.l3 as l3
    rows = re.findall(r"^\| (\d+) \| (\d+) \| (.+?) \|$", L3_DOC, re.M)
    fields = {name: (int(off), int(size)) for off, size, name in rows}
    data = l3.encode(np.array([[10, 20], [30, 40]], np.uint8), 64)
    assert fields["magic `LLL.` (4C 4C 4C 2E)"] == (0, 4) and data[:4] == b"LLL."
    assert fields["width, uint32"] == (4, 4) and struct.unpack_from("<I", data, 4)[0] == 2
    assert fields["height, uint32"] == (8, 4) and struct.unpack_from("<I", data, 8)[0] == 2
    assert fields["patch size N"] == (12, 1) and data[12] == 64
    # the worked example's bytes, as the doc spells them
    assert "`A4 00 0A`" in L3_DOC and "`44 01 0A`" in L3_DOC and "37 bytes in all" in L3_DOC
    assert data[19:25] == bytes.fromhex("A4000A44010A") and len(data) == 37
    # the limits the doc states
    assert "1 <= N <= 128" in L3_DOC and l3.MAX_PATCH == 128
    assert [l3.choose_patch(1279, 719), l3.choose_patch(1920, 1080), l3.choose_patch(1921, 1080)] \
        == [32, 64, 128]


def test_index_part_table_matches_the_writer(small_src, tmp_path):
    """A --part build keeps its index parts until --finalize: the table in docs/FORMAT.md
    reads them; each holds exactly the record's first H bytes and its l3 sidecar."""
    import xxhash
    run_pcrfs("build", small_src, tmp_path / "ds", "--images-per-record", 5, "--part", "0/2",
              "-q")
    root = tmp_path / "ds.partial"
    raw = (root / "parts" / "r000001.idx").read_bytes()
    rows = dict((name, (int(off), int(size))) for off, size, name in
                re.findall(r"^\| (\d+\+?H?\+?L?) \| (\w+) \| (.+?) \|$", DOC, re.M)
                if off.isdigit() and size.isdigit())
    def get(name):
        off, size = rows[name]
        return int.from_bytes(raw[off:off + size], "little")
    assert raw[:8] == b"PCRFSIXP" and rows["magic `PCRFSIXP`"] == (0, 8)
    assert get("version (1)") == 1
    h = get("H: length of the record's header and metadata")
    n = get("L: length of its l3 sidecar (0: none)")
    rec = (root / "records" / "r000001.pcr").read_bytes()
    l3m = (root / "records" / "r000001.l3m").read_bytes()
    assert raw[20:20 + h] == rec[:h] and raw[20 + h:20 + h + n] == l3m
    assert len(raw) == 20 + h + n + 8
    assert int.from_bytes(raw[-8:], "little") == xxhash.xxh3_64_intdigest(raw[:-8])


def test_performance_tables_are_generated_from_the_bench_results():
    """docs/PERFORMANCE.md's tables are bench/perf_doc.py's output for bench/results/*.json:
    a benchmark rerun without regenerating them fails here."""
    import subprocess
    import sys
    repo = Path(__file__).parent.parent
    r = subprocess.run([sys.executable, "-P", "-m", "bench.perf_doc", "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, "docs/PERFORMANCE.md is stale: run python -m bench.perf_doc"
    text = (repo / "docs" / "PERFORMANCE.md").read_text()
    for p in (repo / "bench" / "results").glob("*.json"):
        assert f"`bench/results/{p.name}`" in text, p.name


def test_the_readme_is_a_guide_whose_links_resolve():
    repo = Path(__file__).parent.parent
    readme = (repo / "README.md").read_text()
    assert len(readme.splitlines()) < 280
    assert "make demo" in readme and "make test" in readme
    links = re.findall(r"\]\(([^)#]+)\)", readme)
    assert links and all((repo / link).exists() for link in links), links


def test_cli_and_options_docs_are_generated_from_the_code():
    """docs/CLI.md is argparse's help of every command, docs/OPTIONS.md the mount option
    table: a flag or an option added without its doc fails here."""
    import subprocess
    import sys

    from pcrfs.fs.options import OPTIONS, options_markdown
    repo = Path(__file__).parent.parent
    sys.path.insert(0, str(repo / "tools"))
    import cli_doc
    assert (repo / "docs" / "OPTIONS.md").read_text() == options_markdown(), \
        "docs/OPTIONS.md is stale: run tools/cli_doc.py"
    assert (repo / "docs" / "CLI.md").read_text() == cli_doc.cli_markdown(), \
        "docs/CLI.md is stale: run tools/cli_doc.py"
    assert all(o.help for o in OPTIONS.values())
    helptext = subprocess.run([sys.executable, "-P", "-m", "pcrfs.cli", "mount", "--help"],
                              capture_output=True, text=True, env={"COLUMNS": "1000"}).stdout
    assert all(o.usage in helptext for o in OPTIONS.values())


# A measured figure as prose writes one: a decimal, or a count with a unit of rate, time
# or ratio.  Parameters (400 images, 16 cores, 5 MB/s limits) are plain integers.
_FIGURE = re.compile(r"(?<![\w.])(\d+\.\d+|\d[\d,]*(?:\.\d+)?(?:x|%| ?µs| ?ms| ?MiB| ?files/s"
                     r"| ?images/s| ?img/s| ?dB| ?MP/s))(?![\w.])")
# a target's verdict typed as a figure is: "target 2: met", "**missed**"
_VERDICT = re.compile(r":\s*\**(met|missed)\b|\*\*(met|missed)\*\*")
_VERSION = re.compile(r"(\b(Linux|libfuse|Python|Ubuntu|Debian|GCC|CUDA|kernels?|Theorem|v) |§)$")


def _hand_written(text: str) -> str:
    """What a person typed: generated blocks, placeholders, code and comments removed."""
    text = re.sub(r"<!-- generated by bench/perf_doc\.py:.*?<!-- generated: end -->", "", text,
                  flags=re.S)
    text = re.sub(r"<!--fig .*?<!--/fig-->", "FIG", text, flags=re.S)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "CODE", text)
    return re.sub(r"\]\([^)]*\)", "]", text)


def typed_figures(text: str) -> list[str]:
    """Figures typed by hand: each with its context.  A number within a few words after
    'target' is a goal, not a measurement, and a version number is neither."""
    found = []
    for line in _hand_written(text).splitlines():
        if line.startswith("|") and re.search(r"(?<![\w/.])\d", line):
            found.append(f"table row: {line[:100]}")
            continue
        for m in _VERDICT.finditer(line):
            found.append(f"verdict: {line[max(0, m.start() - 40):m.end()]}")
        for m in _FIGURE.finditer(line):
            before = line[max(0, m.start() - 24):m.start()]
            if "target" in before or _VERSION.search(line[:m.start()]):
                continue
            found.append(line[max(0, m.start() - 40):m.end() + 20])
    return found


def test_typed_figures_are_found():
    assert typed_figures("pcrfs ran at 1.76x WebDataset") == ["pcrfs ran at 1.76x WebDataset"]
    assert typed_figures("| q10 | 5,454 files/s |") == ["table row: | q10 | 5,454 files/s |"]
    assert typed_figures("it took 110 µs per file") and typed_figures("a 98% hit ratio")
    assert not typed_figures("pcrfs ran at <!--fig peers a.b .2f-->1.76<!--/fig-->x WebDataset")
    assert not typed_figures("400 images, 16 cores, limited to 5 MB/s; `-o x=0.5`; Linux 6.14")
    assert typed_figures("(target 0.9: missed) 500x375 crops") and typed_figures("is **met**")
    assert not typed_figures("(target 0.9: <!--fig b r/t atleast-->missed<!--/fig-->) 500x375")


def test_readme_and_performance_figures_all_come_from_the_bench_results():
    """Every measured number in README.md, docs/PERFORMANCE.md and the guides whose
    prose is all measurement (BUILD's costs, TRAINING's qualities, LIQUID's runs) is a placeholder the
    generator fills from bench/results (test_performance_tables_are_generated... holds
    each to its JSON) or sits in a generated block; none is typed."""
    repo = Path(__file__).parent.parent
    for doc in ("README.md", "docs/PERFORMANCE.md", "docs/BUILD.md", "docs/TRAINING.md",
                "docs/LIQUID.md"):
        found = typed_figures((repo / doc).read_text())
        assert not found, f"{doc}: figures typed by hand (use <!--fig--> placeholders): {found[:8]}"
