"""Building over a hostile tree: deep nesting, 10k files in one directory, names with
spaces, newlines, unicode and invalid UTF-8, symlinks (followed, loops walked once),
empty class directories, non-image files, and decompression bombs refused by
--max-pixels from the header alone, without the memory a decode would take."""
import io
import os
import struct
import subprocess
import sys
import zlib

import numpy as np
from PIL import Image

import pcrfs


def _jpeg(seed=0, size=(24, 16)):
    rng = np.random.default_rng(seed)
    im = Image.fromarray(rng.integers(0, 255, (*size[::-1], 3), dtype=np.uint8))
    out = io.BytesIO()
    im.save(out, "JPEG", quality=80)
    return out.getvalue()


def _jpeg_bomb(w=60000, h=60000):
    """A small real JPEG whose SOF claims w x h."""
    data = bytearray(_jpeg(1))
    sof = data.find(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", h, w)
    return bytes(data)


def _png_bomb(w=60000, h=60000):
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    idat = zlib.compress(b"\0" * 64)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def test_hostile_tree_builds_and_mounts(tmp_path, mount, record):
    src = tmp_path / "src"
    jpg = _jpeg()
    expect = {}

    def put(rel: bytes, data: bytes, ok=True):
        p = os.path.join(os.fsencode(src), rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
        if ok:
            expect[rel] = data

    deep = b"/".join(b"d%02d" % i for i in range(40))
    put(b"deep/" + deep + b"/x.jpg", jpg)
    for i in range(10_000):
        put(b"big/%05d.jpg" % i, jpg)
    weird = [b"with space.jpg", b"new\nline.jpg", "ünïcødé_画像.jpg".encode(), b"latin1_\xe9\xff.jpg",
             b" leading.jpg", b"-dash.jpg", b"semi;colon'quote\".jpg", b"tab\there.jpg"]
    for n in weird:
        put(b"names/" + n, _jpeg(len(n)))
    (src / "empty_class").mkdir()
    put(b"names/readme.txt", b"notes\n", ok=False)
    put(b"names/fake.jpg", b"\xff\xd8\xff\xe0 this is not a jpeg", ok=False)
    put(b"bombs/jpeg_60000x60000.jpg", _jpeg_bomb(), ok=False)
    put(b"bombs/png_60000x60000.png", _png_bomb(), ok=False)
    # symlinks: a file link and a directory link are followed; a loop is walked once
    os.symlink("with space.jpg", src / "names" / "link.jpg")
    expect[b"names/link.jpg"] = (src / "names" / "with space.jpg").read_bytes()
    os.symlink("..", src / "names" / "loop")
    os.symlink("/nonexistent/target.jpg", src / "names" / "dangling.jpg")
    files = sum(len(f) for _, _, f in os.walk(src))
    dst = tmp_path / "ds"
    # the build in its own process, reporting its own peak RSS: VmHWM, which belongs to the
    # process image (ru_maxrss would include this pytest process, inherited across exec)
    wrapper = ("import sys; from pcrfs.cli import main; rc = main(sys.argv[1:]); "
               "hwm = next(x for x in open('/proc/self/status') if x.startswith('VmHWM')); "
               "print('MAXRSS_KIB', hwm.split()[1], file=sys.stderr); sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", wrapper, "build", str(src), str(dst), "-q",
                        "--images-per-record", "512", "--views", "none"], capture_output=True, text=True,
                       cwd=tmp_path)   # not the repo root: import the installed package
    assert r.returncode == 0, r.stderr
    peak_kib = int(r.stderr.split("MAXRSS_KIB")[1].split()[0])
    report = (dst / "build-report.json").read_text()
    assert "too many pixels: 60000x60000" in report and report.count("too many pixels") == 2
    assert "not an image" in report or "JPEG rejected" in report
    # a 60000^2 decode would need 10 GiB; the build stayed small
    assert peak_kib < 1_000_000, peak_kib
    ds = pcrfs.open_dataset(str(dst))
    assert ds.manifest["images"] == len(expect), r.stdout
    assert ds.classes == ["big", "bombs", "deep", "empty_class", "names"]
    m = mount(dst)
    top = os.path.join(os.fsencode(m.mnt), b"q%d" % ds.groups)
    served = 0
    for rel, data in expect.items():
        with open(os.path.join(top, rel), "rb") as f:
            got = f.read()
        with Image.open(io.BytesIO(got)) as a, Image.open(io.BytesIO(data)) as b:
            assert np.array_equal(np.asarray(a), np.asarray(b)), rel   # lossless
        served += 1
    assert len(os.listdir(os.path.join(top, b"big"))) == 10_000
    assert os.listdir(os.path.join(top, b"empty_class")) == []
    assert b"loop" not in os.listdir(os.path.join(top, b"names"))
    record(hostile="tree", files_in_tree=files, images_built=len(expect), served_exact=served,
           bombs_refused=2, build_peak_rss_kib=peak_kib)
