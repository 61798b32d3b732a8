"""Custom scan scripts in jpegtran's `-scans` syntax.

    # comment
    0,1,2: 0-0, 0, 1 ;      components : Ss-Se, Ah, Al ;
    0: 1-5, 0, 2 ;
A scan with no ':' part is a DC-only sequential-style scan (0-63, 0, 0) as in jpegtran."""
from __future__ import annotations

import re

from pcrfs.errors import PcrfsError


def parse_scan_script(text: str) -> tuple[list[list[int]], int]:
    """Rows of (ncomps, c0..c3, Ss, Se, Ah<<4|Al) for pcr_transcode, and the component
    count the script is written for (max index + 1)."""
    text = re.sub(r"#[^\n]*", "", text)
    rows, ncomp = [], 0
    for n, scan in enumerate(s.strip() for s in text.split(";")):
        if not scan:
            continue
        comps_part, _, params = scan.partition(":")
        try:
            comps = [int(c) for c in re.split(r"[\s,]+", comps_part.strip()) if c]
            if params.strip():
                rng, ah, al = [p.strip() for p in params.split(",")]
                ss, se = (int(x) for x in rng.split("-"))
                ah, al = int(ah), int(al)
            else:
                ss, se, ah, al = 0, 63, 0, 0
        except ValueError:
            raise PcrfsError(f"scan script: cannot parse scan {n + 1}: {scan!r}") from None
        if not 1 <= len(comps) <= 4 or any(c < 0 or c > 3 for c in comps):
            raise PcrfsError(f"scan script: scan {n + 1} needs 1-4 component indices 0-3")
        if not (0 <= ss <= se <= 63 and 0 <= ah <= 13 and 0 <= al <= 13):
            raise PcrfsError(f"scan script: scan {n + 1} has out-of-range Ss/Se/Ah/Al")
        ncomp = max(ncomp, max(comps) + 1)
        rows.append([len(comps), *(comps + [0] * (4 - len(comps))), ss, se, (ah << 4) | al])
    if not rows:
        raise PcrfsError("scan script: no scans")
    return rows, ncomp
