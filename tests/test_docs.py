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
