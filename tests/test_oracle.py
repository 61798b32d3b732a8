"""Every fidelity view against an oracle that shares no code with pcrfs: libjpeg-turbo's
own `jpegtran -progressive` (the same simple progression the build uses), cut after
scan k by a marker walk written here, plus EOI, decoded by `djpeg`.  The pixels of
MNT/qk must equal the oracle's for every k, so the middle views q2..q(G-1) are checked
against something other than the daemon's own read path."""
import os
import random
import subprocess


def _scan_ends(jpeg: bytes) -> list[int]:
    """Offsets where each scan's entropy-coded data ends (independent of pcrfs/csrc)."""
    assert jpeg[:2] == b"\xff\xd8"
    pos, ends = 2, []
    while pos < len(jpeg):
        assert jpeg[pos] == 0xFF, pos
        while jpeg[pos] == 0xFF:          # fill bytes
            pos += 1
        marker = jpeg[pos]
        pos += 1
        if marker == 0xD9:                # EOI
            break
        seglen = int.from_bytes(jpeg[pos : pos + 2], "big")
        pos += seglen
        if marker != 0xDA:                # not SOS: a table or header segment
            continue
        while True:                       # entropy-coded data up to the next real marker
            pos = jpeg.index(b"\xff", pos)
            nxt = jpeg[pos + 1]
            if nxt == 0x00 or 0xD0 <= nxt <= 0xD7:   # stuffed byte or restart marker
                pos += 2
                continue
            break
        ends.append(pos)
    return ends


def _pixels(jpeg: bytes) -> bytes:
    return subprocess.run(["djpeg", "-ppm"], input=jpeg, capture_output=True,
                          check=True).stdout


def test_every_view_equals_jpegtran_cut_after_scan_k(crops_src, crops_ds, mount):
    m = mount(crops_ds)
    groups = len([v for v in os.listdir(m.mnt) if v[0] == "q"])
    sources = sorted(p for p in crops_src.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
    random.Random(3).shuffle(sources)
    checked = distinct = 0
    for src in sources[:12]:
        rel = src.relative_to(crops_src)
        prog = subprocess.run(["jpegtran", "-progressive", "-copy", "none", str(src)],
                              capture_output=True, check=True).stdout
        ends = _scan_ends(prog)
        assert len(ends) == 10                       # YCbCr simple progression
        prev = None
        for k in range(1, groups + 1):
            oracle = _pixels(prog[: ends[min(k, len(ends)) - 1]] + b"\xff\xd9")
            got = (m.mnt / f"q{k}" / rel).read_bytes()
            assert _pixels(got) == oracle, f"q{k}/{rel}"
            checked += 1
            distinct += prev is not None and oracle != prev
            prev = oracle
        assert _pixels(prog) == _pixels(src.read_bytes())   # lossless: the full view
    assert checked == 12 * groups
    assert distinct >= 12 * (groups - 2)    # neighbouring views differ: a swap would show
