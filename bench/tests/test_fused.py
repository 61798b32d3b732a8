"""bench/fused.py's interval reach: what a crop needs of a restart-marked progressive file."""
import io

import numpy as np
from PIL import Image

from bench import fused
from pcrfs import native


def _progressive(w=256, h=512, restart_rows=1) -> bytes:
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (h, w, 3), np.uint8)).save(buf, "JPEG", quality=90)
    return native.transcode(buf.getvalue(), restart_rows=restart_rows).data


def test_a_whole_image_box_needs_every_interval_and_a_strip_needs_its_rows():
    data = _progressive()
    whole = fused.interval_reach([data], [((0, 0, 512, 256), False)])
    assert whole["needed_bytes_fraction"] == 1.0
    strip = fused.interval_reach([data], [((0, 0, 64, 256), False)])
    # 64 rows (+16 of margin) of 512: about a sixth of the intervals' bytes, not all
    assert 0.08 < strip["needed_bytes_fraction"] < 0.3
