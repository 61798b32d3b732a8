"""pcrfs.torch.decode_jpeg and the restart intervals the build writes for it.

The decoder's contract is Pillow's pixels, exactly: every test compares against
Image.open(...) of the same bytes (libjpeg-turbo with its defaults: block smoothing,
islow IDCT, fancy upsampling).  The measured largest difference is 0 on every file here;
a regression shows as the first mismatching file and its difference.

CI has no GPU: the Triton entropy kernel runs in Triton's interpreter and is compiled to
sm_80 and sm_90 cubins (no driver needed) to prove it builds; `pcrfs-bench --only
gpu_decode` checks the compiled kernel's pixels against Pillow on the GPU host."""
import io
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from pcrfs import jpeg as cjpeg
from pcrfs import native
from pcrfs.torch import jpeg_triton
from pcrfs.torch.jpeg import DecodeError, decode_jpeg, decode_jpeg_canvases, stats

from conftest import run_pcrfs
from edgecases import cjpeg_encode, edge_cases, jpegtran, photo_like, save, views


def pillow(blob: bytes, mode: str | None = None) -> np.ndarray:
    with Image.open(io.BytesIO(blob)) as im:
        a = np.asarray(im.convert(mode) if mode else im)
    return a if a.ndim == 3 else a[:, :, None]


def assert_pillow_pixels(blobs, outs, mode=None):
    for i, (b, o) in enumerate(zip(blobs, outs, strict=True)):
        want = pillow(b, mode)
        assert o is not None, f"blob {i} not decoded"
        got = o.permute(1, 2, 0).cpu().numpy()
        assert got.shape == want.shape, (i, got.shape, want.shape)
        diff = np.abs(got.astype(int) - want).max()
        assert diff == 0, f"blob {i}: largest difference {diff} on {(got != want).mean():.2%} of samples"


def cjpeg_sampled(w: int, h: int, sample: str, seed: int = 0, quality: int = 85) -> bytes:
    return cjpeg_encode(Image.fromarray(photo_like(w, h, seed)), sample, quality)


def sampled_jpegs() -> dict[str, bytes]:
    """Every chroma layout the issue names (4:4:4, 4:2:2, 4:2:0, 4:4:0, gray) and the
    replicated ones (4:1:1, 1x4), at sizes that leave partial MCUs."""
    out = {s: cjpeg_sampled(61, 45, s, i) for i, s in enumerate(
        ["1x1", "2x1", "2x2", "1x2", "4x1", "1x4", "2x1,1x2,1x1"])}
    out["gray"] = save(Image.fromarray(photo_like(37, 29, 9)).convert("L"), quality=88)
    out["2x2_width2"] = cjpeg_sampled(3, 21, "2x2", 3)   # chroma 2 wide: libjpeg replicates
    return out


def test_restart_markers_are_lossless_in_every_view():
    """A restart marker per MCU row of every scan (the densest; the build's default is 3):
    the same pixels at every fidelity, and a DRI before the first scan of each image."""
    for name, jpeg in sampled_jpegs().items():
        plain, marked = views(jpeg, 0), views(jpeg, 1)
        assert len(plain) == len(marked)
        assert b"\xff\xdd" in marked[0] and b"\xff\xdd" not in plain[-1], name
        for a, b in zip(plain, marked, strict=True):
            assert (pillow(a) == pillow(b)).all(), name
        assert (pillow(marked[-1]) == pillow(jpeg)).all(), name
        p = cjpeg.parse(marked[-1])
        assert all(s[cjpeg.S["restart"]] > 0 for s in p.scans)
        # one MCU row per interval: rows of the scan's MCUs
        for s in p.scans:
            rows = -(-s[cjpeg.S["mcus"]] // s[cjpeg.S["mcus_per_row"]])
            assert s[cjpeg.S["n_intervals"]] == rows


def test_restart_intervals_balanced_by_bytes_are_lossless_and_short():
    """--restart-bytes: each scan restarts as often as keeps its intervals within B bytes
    (in steps of 4 MCUs), so the DC and chroma scans get few markers and the luma AC scans
    many; the same coefficients and pixels, in every view, and the longest interval
    within B where 4 MCUs fit, far shorter than a restart every 3 rows gives."""
    for name, jpeg in list(sampled_jpegs().items()) + [("photo", cjpeg_sampled(200, 152, "2x2", 3, 90))]:
        rows = native.transcode(jpeg, restart_rows=3).data
        by = native.transcode(jpeg, restart_bytes=120).data
        p, q = cjpeg.parse(by), cjpeg.parse(rows)
        assert (cjpeg.entropy_decode(p) == cjpeg.entropy_decode(q)).all(), name
        assert (pillow(by) == pillow(jpeg)).all(), name
        a = [by[:e] + b"\xff\xd9" for e in native.split_scans(by)]
        b = [rows[:e] + b"\xff\xd9" for e in native.split_scans(rows)]
        assert len(a) == len(b), name
        assert all((pillow(x) == pillow(y)).all() for x, y in zip(a, b, strict=True)), name
        # within 120 bytes unless an interval is one 4-MCU step (the finest it cuts)
        for v in p.intervals:
            s = p.scans[v["scan"]]
            assert v["data_len"] <= 120 or v["n_mcus"] <= 4 or s[cjpeg.S["restart"]] == 0, name
        if name == "photo":
            assert len(set(p.scans[:, cjpeg.S["restart"]].tolist())) > 2     # a DRI per scan
            assert p.intervals["data_len"].max() * 3 < q.intervals["data_len"].max()
    with pytest.raises(native.NativeError):
        native.transcode(jpeg, restart_bytes=-1)


def test_build_writes_restart_intervals_and_info_says_so(small_src, tmp_path):
    marked, plain = tmp_path / "marked", tmp_path / "plain"
    run_pcrfs("build", small_src, marked, "-q")
    run_pcrfs("build", small_src, plain, "-q", "--restart-rows", "0")
    out = run_pcrfs("info", marked).stdout
    assert "restarts    every 3 MCU rows of every scan" in out
    assert "restarts    none" in run_pcrfs("info", plain).stdout
    rc = run_pcrfs("build", small_src, tmp_path / "bad", "-q", "--restart-rows", "-1", check=False)
    assert rc.returncode != 0 and "--restart-rows" in rc.stderr
    by = tmp_path / "by-bytes"
    run_pcrfs("build", small_src, by, "-q", "--restart-bytes", "60")
    assert "at most 60 entropy-coded bytes" in run_pcrfs("info", by).stdout
    from pcrfs.dataset import open_dataset
    with open_dataset(str(marked)) as a, open_dataset(str(plain)) as b, open_dataset(str(by)) as c:
        assert a.manifest["build"]["restart_rows"] == 3 and b.manifest["build"]["restart_rows"] == 0
        assert c.manifest["build"]["restart_bytes"] == 60 and "restart_bytes" not in a.manifest["build"]
        cost = a.manifest["dataset_bytes"] / b.manifest["dataset_bytes"] - 1
        assert 0 < cost < 0.08, cost   # 96x64 images; pcrfs-bench --only build measures real sizes
        rels = sorted(os.path.relpath(os.path.join(d, f), small_src)
                      for d, _, fs in os.walk(small_src) for f in fs)[:6]
        for rel in rels:
            for k in (1, 3, a.manifest["groups"]):
                x, y, z = a.read(rel, f"q{k}"), b.read(rel, f"q{k}"), c.read(rel, f"q{k}")
                assert x != y and (pillow(x) == pillow(y)).all() and (pillow(z) == pillow(y)).all()


def test_decode_equals_pillow_on_every_layout_and_view():
    blobs = []
    for jpeg in sampled_jpegs().values():
        blobs += [jpeg] + views(jpeg, 1) + views(jpeg, 0)[::3] + views(jpeg, 2)[-1:]
    before = stats["cpu_images"]
    assert_pillow_pixels(blobs, decode_jpeg(blobs, "cpu"))
    assert stats["cpu_images"] - before == len(blobs)


_COEF_SHA = """
import hashlib, sys
from pcrfs import jpeg as cjpeg
from pcrfs import native
h = hashlib.sha1()
for path in sys.argv[1:]:
    h.update(cjpeg.entropy_decode(cjpeg.parse(open(path, "rb").read())).tobytes())
print(h.hexdigest())
"""


def test_refinement_with_and_without_pdep_gives_the_same_coefficients(tmp_path):
    """An AC refinement finds the coefficient a run of r ends at with one pdep where the
    CPU has a fast one, with a loop elsewhere (PCRFS_NO_PDEP=1 forces the loop): the same
    coefficients either way, on every view of every layout.  A wrong skip count shifts
    every later coefficient of its block."""
    paths = []
    for name, jpeg in sampled_jpegs().items():
        for rows in (1, 0):
            for i, v in enumerate(views(jpeg, rows)):
                paths.append(tmp_path / f"{name.replace(',', '_')}-{rows}-{i}.jpg")
                paths[-1].write_bytes(v)
    runs = {}
    for off in ("0", "1"):
        env = dict(os.environ, PCRFS_NO_PDEP=off)
        runs[off] = subprocess.run([sys.executable, "-P", "-c", _COEF_SHA, *map(str, paths)], env=env,
                                   capture_output=True, text=True, check=True).stdout.strip()
    assert len(paths) > 100 and len(runs["0"]) == 40 and runs["0"] == runs["1"]


def test_decode_equals_pillow_on_the_edge_cases():
    blobs = []
    for rel, (data, kind) in sorted(edge_cases().items()):
        if kind == "jpeg" and not rel.startswith((b"jpeg/cmyk", b"jpeg/arith")):
            blobs += [data] + views(data, 1)[::2]
    blobs.append(jpegtran(edge_cases()[b"jpeg/baseline_422.jpg"][0], "-restart", "1"))  # baseline + DRI
    assert_pillow_pixels(blobs, decode_jpeg(blobs, "cpu"))


def test_decode_through_the_mount_equals_pillow(crops_src, crops_ds, mount):
    """ImageNet-like crops read back through the kernel from q1, q4, q10 and the source."""
    m = mount(crops_ds)
    rels = sorted(os.path.relpath(os.path.join(d, f), crops_src)
                  for d, _, fs in os.walk(crops_src) for f in fs)[::20]
    blobs = [(crops_src / r).read_bytes() for r in rels]
    for k in (1, 4, 10):
        blobs += [(m.mnt / f"q{k}" / r).read_bytes() for r in rels]
    outs = decode_jpeg(blobs, "cpu", mode="rgb")
    assert_pillow_pixels(blobs, outs, "RGB")
    assert all(o.shape == (3, 375, 500) for o in outs)


def test_fallbacks_are_counted_and_give_pillows_pixels():
    cases = edge_cases()
    cmyk, arith = cases[b"jpeg/cmyk.jpg"][0], cases[b"jpeg/arithmetic.jpg"][0]
    before = stats["fallback_images"]
    outs = decode_jpeg([cmyk, arith], "cpu", mode="rgb")
    assert stats["fallback_images"] - before == 2
    assert_pillow_pixels([cmyk, arith], outs, "RGB")
    assert decode_jpeg([cmyk], "cpu")[0].shape[0] == 4   # unchanged: CMYK's four channels
    with pytest.raises(cjpeg.Unsupported, match="12-bit"):
        cjpeg.parse(cases[b"bad/twelve_bit.jpg"][0])


def test_a_bad_image_costs_only_itself():
    good = [save(Image.fromarray(photo_like(48, 32, s)), quality=90) for s in range(3)]
    marked = views(good[1], 1)[-1]
    body = bytearray(marked)
    sos = body.rfind(b"\xff\xda")
    body[sos + 20: sos + 60] = b"\xff" * 40          # entropy bytes become fill: scan cut short
    bad = {1: marked[: len(marked) // 2], 3: bytes(body), 4: b"\xff\xd8\xff\xe0garbage", 6: b""}
    batch = [good[0], bad[1], good[1], bad[3], bad[4], marked, bad[6], good[2]]
    with pytest.raises(DecodeError) as e:
        decode_jpeg(batch, "cpu")
    assert e.value.index == 1 and "image 1 of the batch" in str(e.value)
    outs = decode_jpeg(batch, "cpu", on_error="none")
    assert [i for i, o in enumerate(outs) if o is None] == [1, 3, 4, 6]
    ok = [0, 2, 5, 7]
    assert_pillow_pixels([batch[i] for i in ok], [outs[i] for i in ok])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_damage_never_crashes_or_hangs(data):
    """Any byte changed, cut or inserted: a DecodeError or an image of the header's size."""
    src = views(save(Image.fromarray(photo_like(24, 16, 5)), quality=80), 1)
    blob = bytearray(data.draw(st.sampled_from([src[-1], src[2]])))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(blob) - 1))
        op = data.draw(st.sampled_from(["set", "cut", "insert"]))
        if op == "set":
            blob[at] = data.draw(st.integers(0, 255))
        elif op == "cut":
            del blob[at: at + data.draw(st.integers(1, 64))]
        else:
            blob[at:at] = bytes(data.draw(st.lists(st.integers(0, 255), min_size=1, max_size=8)))
    out = decode_jpeg([bytes(blob)], "cpu", on_error="none")[0]
    if out is not None:
        p = cjpeg.parse(bytes(blob))
        assert out.shape == (p.ncomp if p.ncomp != 4 else 4, p.height, p.width)


def tiny_set() -> list[bytes]:
    """Small enough for the interpreter: every scan kind, interleaved or not."""
    a = save(Image.fromarray(photo_like(24, 16, 1)), quality=90)                   # 4:2:0
    b = save(Image.fromarray(photo_like(13, 19, 2)), quality=75, subsampling=1)    # 4:2:2
    c = save(Image.fromarray(photo_like(20, 12, 3)).convert("L"), quality=85)
    return [a, views(a, 1)[-1], views(a, 0)[-1], views(a, 1)[4], jpegtran(b, "-restart", "1"),
            views(b, 1)[-1], views(c, 1)[-1], views(c, 1)[1],
            native.transcode(a, restart_bytes=24).data]      # a restart interval per scan


def test_triton_kernel_gives_the_c_decoders_coefficients(interpreted):
    blobs = tiny_set()
    ps = [cjpeg.parse(b) for b in blobs]
    firsts = list(np.cumsum([0] + [p.total_blocks for p in ps])[:-1])
    coefs = torch.zeros((sum(p.total_blocks for p in ps), 64), dtype=torch.int16)
    assert jpeg_triton.entropy_decode(ps, firsts, coefs) == {}
    for p, f in zip(ps, firsts, strict=True):
        assert (coefs[f: f + p.total_blocks].numpy() == cjpeg.entropy_decode(p)).all()
    # the whole path with the kernel, pixels included
    assert_pillow_pixels(blobs[:2], decode_jpeg(blobs[:2], "cpu", backend="triton"))


def test_entropy_launches_group_scans_of_disjoint_coefficients():
    """One launch per dependency level, not per scan: libjpeg's 10-scan colour script in 3
    (4:2:0 q10: 3 launches for the whole batch), grey's 6 in 3.  Within a level no two scans
    of an image touch one coefficient of one component (the kernel's programs of a launch
    run in any order on a GPU, which the interpreter's in-order run cannot show), and every
    scan runs after each earlier scan that does."""
    def touched(p, i):
        row = p.scans[i]
        comps = row[[cjpeg.S[f"comp{c}"] for c in range(row[cjpeg.S["ncomp"]])]]
        return {(int(c), k) for c in comps
                for k in range(row[cjpeg.S["Ss"]], row[cjpeg.S["Se"]] + 1)}
    blobs = tiny_set()
    ps = [cjpeg.parse(b) for b in blobs]
    levels = jpeg_triton.scan_levels(ps)
    base = 0
    for p in ps:
        lv = levels[base: base + len(p.scans)]
        base += len(p.scans)
        for i in range(len(p.scans)):
            for j in range(i):
                if touched(p, i) & touched(p, j):
                    assert lv[i] > lv[j], (i, j, lv)
    q10 = [cjpeg.parse(views(save(Image.fromarray(photo_like(32, 24, s)), quality=90), 1)[-1])
           for s in range(4)]
    assert all(len(p.scans) == 10 for p in q10)
    where = jpeg_triton.descriptors(q10, [0] * 4)[4]
    assert len(np.unique(where[:, 2])) == 3
    assert list(where[:, 2]) == sorted(where[:, 2])           # launch order
    grey = ps[6]
    assert len(set(jpeg_triton.scan_levels([grey]))) == 3 and len(grey.scans) == 6


def test_fused_pixel_kernels_give_pillows_pixels(interpreted):
    """pcrfs.torch.pixels_triton (the pixel stage on CUDA) in Triton's interpreter: every
    chroma layout, sources and incomplete progressive views (block smoothing), images of
    several sizes on one canvas (each image's edge replication beyond its own samples; the
    kernels leave the padding past them unwritten), grey beside colour: Pillow's pixels
    exactly, and the torch path's image for image."""
    from pcrfs.torch import jpeg as tj
    jp = sampled_jpegs()
    blobs = [jp["2x2"], cjpeg_sampled(57, 43, "2x2", 5), cjpeg_sampled(52, 41, "2x2", 6),
             views(jp["2x2"], 1)[1], jp["2x1"], views(jp["1x2"], 1)[2], jp["1x1"], jp["4x1"],
             jp["gray"], jp["2x2_width2"], views(jp["2x1,1x2,1x1"], 1)[-1]]
    fused = decode_jpeg_canvases(blobs, "cpu", backend="triton", mode="rgb")
    plain = decode_jpeg_canvases(blobs, "cpu", backend="c", mode="rgb")
    assert len(fused) >= 6
    mine = {i: c[k, :, :h, :w] for m, c, sizes, _ in plain
            for k, (i, (h, w)) in enumerate(zip(m, sizes, strict=True))}
    for m1, c1, sizes, _ in fused:
        got = [c1[k, :, :h, :w] for k, (h, w) in enumerate(sizes)]
        for i, g in zip(m1, got, strict=True):
            assert torch.equal(g, mine[i]), i
        assert_pillow_pixels([blobs[i] for i in m1], got, "RGB")
    assert sorted(i for m, _, _, _ in fused for i in m) == list(range(len(blobs)))
    assert any(len(m) >= 3 for m, _, _, _ in fused)     # the 4:2:0 sizes share a canvas
    assert tj.pxk.kernels.cache_info().currsize == 1     # the kernels were built and ran


def test_batch_descriptors_in_c_describe_each_image_as_parsed():
    """csrc/jpeg_batch.c's rows, read back against each image's own parse: every interval's
    bytes are its own, its scan row holds its scan's fields, blocks and tables (offset to
    where its image lands in the batch), levels are scan_levels' and come in launch order,
    and counts are the launches' sizes.  An interval the parser could not have produced is
    refused, not read."""
    ps = [cjpeg.parse(b) for b in tiny_set()]
    firsts = list(np.cumsum([7] + [p.total_blocks for p in ps])[:-1])
    data, tables, rows, iv, where, counts = jpeg_triton.descriptors(ps, firsts)
    assert len(iv) == sum(len(p.intervals) for p in ps) and len(rows) == sum(len(p.scans) for p in ps)
    scan_base = np.cumsum([0] + [len(p.scans) for p in ps])
    tab_base = np.cumsum([0] + [len(p.tables) for p in ps]) * cjpeg.HUFF_WORDS
    levels = jpeg_triton.scan_levels(ps)
    seen = set()
    for (start, end, first, n, row), (j, s, lv) in zip(iv.tolist(), where.tolist(), strict=True):
        p = ps[j]
        k = next(k for k, v in enumerate(p.intervals) if v["scan"] == s and v["first_mcu"] == first)
        seen.add((j, k))
        v = p.intervals[k]
        assert bytes(data[start:end]) == bytes(p.data[v["data_off"]: v["data_off"] + v["data_len"]])
        assert n == v["n_mcus"] and row == scan_base[j] + s and lv == levels[row]
        sc, r = p.scans[s], rows[row]
        assert list(r[:6]) == [sc[cjpeg.S[f]] for f in ("kind", "ncomp", "Ss", "Se", "Al", "mcus_per_row")]
        for c in range(sc[cjpeg.S["ncomp"]]):
            comp = sc[cjpeg.S[f"comp{c}"]]
            f = r[6 + 6 * c: 12 + 6 * c]
            assert f[0] == firsts[j] + p.coef_offset[comp] and f[1] == p.bw[comp]
            single = sc[cjpeg.S["ncomp"]] == 1
            assert (f[2], f[3]) == ((1, 1) if single else (p.h[comp], p.v[comp]))
            for word, col in ((f[4], "dc"), (f[5], "ac")):
                t = max(sc[cjpeg.S[f"{col}{c}"]], 0)
                assert (word - tab_base[j]) // cjpeg.HUFF_WORDS == t
                assert (tables.reshape(-1)[word: word + cjpeg.HUFF_WORDS] == p.tables[t]).all()
    assert len(seen) == len(iv)
    assert list(where[:, 2]) == sorted(where[:, 2])
    assert list(counts[counts > 0]) == list(np.bincount(where[:, 2])[np.bincount(where[:, 2]) > 0])
    # staged for a device: the four arrays the kernel reads in one buffer (one upload),
    # each at an aligned offset, equal to the plain ones once viewed on the device
    alloc, held = jpeg_triton.staging(False)
    staged = jpeg_triton.descriptors(ps, firsts, alloc)
    buf, spans = held
    assert len(spans) == 4 and all(o % jpeg_triton.ALIGN == 0 for o, *_ in spans)
    assert all(a.base is not None and np.shares_memory(a, buf.numpy()) for a in staged[:4])
    for plain, dev in zip((data, tables, rows, iv), jpeg_triton.on_device(held, "cpu"), strict=True):
        assert dev.shape == plain.shape and (dev.numpy() == plain).all()
    bad = cjpeg.parse(tiny_set()[1])
    bad.intervals["data_len"][-1] = len(bad.data) + 1         # past its bytes
    with pytest.raises(ValueError):
        jpeg_triton.descriptors([ps[0], bad], [0, ps[0].total_blocks])


def test_triton_kernel_flags_a_damaged_interval_only(interpreted):
    blob = bytearray(views(save(Image.fromarray(photo_like(16, 24, 4)), quality=90), 1)[-1])
    p = cjpeg.parse(bytes(blob))
    iv = p.intervals[len(p.intervals) // 2]
    p.data[iv["data_off"]: iv["data_off"] + iv["data_len"]] = 0xFF   # no code of all ones
    coefs = torch.zeros((p.total_blocks, 64), dtype=torch.int16)
    ok = cjpeg.parse(views(save(Image.fromarray(photo_like(8, 8, 1)), quality=90), 1)[-1])
    both = torch.zeros((p.total_blocks + ok.total_blocks, 64), dtype=torch.int16)
    errors = jpeg_triton.entropy_decode([p, ok], [0, p.total_blocks], both)
    assert list(errors) == [0] and "corrupt" in errors[0]
    assert (both[p.total_blocks:].numpy() == cjpeg.entropy_decode(ok)).all()
    with pytest.raises(cjpeg.JpegError):
        cjpeg.entropy_decode(p, out=coefs.numpy())


def test_a_damaged_image_on_the_gpu_path_costs_only_itself(interpreted):
    """decode_jpeg queues the pixel stage before it reads the kernel's damage flags: the
    damaged image (sharing a canvas with good ones) is reported or left out, and the
    others are still Pillow's pixels."""
    good = [views(save(Image.fromarray(photo_like(16, 24, k)), quality=90), 1)[-1] for k in (2, 3)]
    blob = bytearray(views(save(Image.fromarray(photo_like(16, 24, 4)), quality=90), 1)[-1])
    sos = blob.rfind(b"\xff\xda")
    at = sos + 2 + int.from_bytes(blob[sos + 2: sos + 4], "big") + 2
    assert b"\xff" not in blob[at: at + 8]
    blob[at: at + 8] = b"\xff\x00" * 4                       # all-ones bits: no code
    batch = [good[0], bytes(blob), good[1]]
    with pytest.raises(DecodeError) as e:
        decode_jpeg(batch, "cpu", backend="triton")
    assert e.value.index == 1 and "corrupt" in str(e.value)
    out = decode_jpeg(batch, "cpu", on_error="none", backend="triton")
    assert out[1] is None
    assert_pillow_pixels(good, [out[0], out[2]])


def test_kernels_run_interpreted_after_triton_was_imported_compiled():
    """A process that imported triton before TRITON_INTERPRET was set (as another test or
    library may) still runs every kernel in the interpreter: tl.sum, tl.max and tl.cumsum
    are compiled-mode jit functions there, and the kernels use none of them."""
    code = """
import triton, triton.language
import os; os.environ["TRITON_INTERPRET"] = "1"
import sys; sys.path.insert(0, sys.argv[1])
import torch
from pcrfs.torch.jpeg import decode_jpeg
from test_jpeg_decode import assert_pillow_pixels, photo_like, save, views, Image
blobs = [views(save(Image.fromarray(photo_like(16, 24, 3)), quality=90), 1)[k] for k in (2, -1)]
assert_pillow_pixels(blobs, decode_jpeg(blobs, "cpu", backend="triton"))
print("ok")
"""
    r = subprocess.run([sys.executable, "-P", "-c", code, os.path.dirname(__file__)], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


@pytest.mark.parametrize("arch", [80, 90])
def test_triton_kernel_compiles_for_the_gpu(arch):
    """The kernel as the GPU runs it (not the interpreter): lowered to a cubin."""
    done = jpeg_triton.compiled(arch)
    assert len(done.asm["cubin"]) > 10_000


@pytest.mark.parametrize("arch", [80, 90])
def test_pixel_and_resize_kernels_compile_for_the_gpu(arch):
    """The pixel stage's and the crop-resize's kernels lowered to cubins too: the
    compiler is stricter than the interpreter (it takes no global that is not a
    tl.constexpr, which the IDCT's constants were not until this test)."""
    from pcrfs.torch import pixels_triton, resize_triton
    for build in (pixels_triton.compiled_idct, pixels_triton.compiled_ycc_rgb,
                  pixels_triton.compiled_smoothing, resize_triton.compiled):
        assert len(build(arch).asm["cubin"]) > 2_000, build.__name__


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600), st.integers(0, 2))
def test_parser_refuses_damaged_headers_cleanly(tail, where):
    """Random bytes after a real header prefix: a JpegError or a parse, never a crash."""
    base = views(save(Image.fromarray(photo_like(16, 16, 2)), quality=90), 1)[-1]
    cut = [2, base.find(b"\xff\xc2"), base.find(b"\xff\xda")][where]
    try:
        p = cjpeg.parse(base[:cut] + tail)
    except cjpeg.JpegError:
        return
    assert p.total_blocks >= 1 and len(p.intervals) >= 1


def test_fuzz_regressions_replay():
    """make fuzz's jpeg_decode corpus and crashes: every file parses or is refused, and
    decodes or is refused, in the same C the fuzzer ran."""
    where = os.path.join(os.path.dirname(__file__), "fuzz_regressions", "jpeg_decode")
    files = sorted(os.path.join(where, f) for f in os.listdir(where))
    assert any("seed-" in f for f in files), "fuzz_regressions/jpeg_decode must hold the seeds"
    for f in files:
        blob = open(f, "rb").read()
        try:
            p = cjpeg.parse(blob)
        except cjpeg.JpegError:
            continue
        if p.total_blocks <= 1 << 16:
            try:
                cjpeg.entropy_decode(p)
            except cjpeg.JpegError:
                pass


def test_the_idct_as_matrix_products_equals_the_butterflies():
    from pcrfs.torch import jpeg_pixels as px
    g = torch.Generator().manual_seed(0)
    for bound in (40, 2000, 1 << 15):
        x = torch.randint(-bound, bound, (5000, 8, 8), generator=g, dtype=torch.int32)
        x[::2, 3:, :] = 0   # the butterflies' zero-column shortcut in libjpeg
        want = px.idct_islow_butterfly(x.to(torch.int64))
        assert torch.equal(px.idct_islow(x), want)
        # a few blocks at a time (the bounded work space), and dequantised on the way in
        assert torch.equal(px.idct_islow(x, chunk=333), want)
        q = torch.randint(1, 9, (5000, 1, 1), generator=g, dtype=torch.int32)
        assert torch.equal(px.idct_islow(x // q, q.to(torch.float64), chunk=700),
                           px.idct_islow_butterfly((x // q * q).to(torch.int64)))


def test_colour_tables_equal_jdcolors_arithmetic_on_every_sample_triple():
    from pcrfs.torch import jpeg_pixels as px
    a = torch.arange(256)
    for y0 in range(0, 256, 64):
        y, cb, cr = torch.meshgrid(a[y0:y0 + 64], a, a, indexing="ij")
        c, r = cb - 128, cr - 128
        want = torch.stack([y + ((px.CR_R * r + 32768) >> 16),
                            y + ((-px.CB_G * c + 32768 - px.CR_G * r) >> 16),
                            y + ((px.CB_B * c + 32768) >> 16)], 1).clamp(0, 255).to(torch.uint8)
        got = px.ycc_to_rgb(y.to(torch.uint8), cb.to(torch.int16), cr.to(torch.uint8))
        assert torch.equal(got, want)
        # a cropped (non-contiguous) canvas, as _pixels passes them
        assert torch.equal(px.ycc_to_rgb(y[:, :200, :99], cb[:, :200, :99], cr[:, :200, :99]),
                           want[:, :, :200, :99])


def test_mixed_sizes_share_canvases_that_waste_little():
    from pcrfs.torch.jpeg import canvases
    sizes = [(500, 375), (375, 500), (500, 333), (64, 48), (1, 1), (500, 375), (2000, 40), (40, 2000)]
    blobs = [save(Image.fromarray(photo_like(w, h, i)), quality=85) for i, (w, h) in enumerate(sizes)]
    ps = [cjpeg.parse(b) for b in blobs]
    chunks = canvases(list(range(len(ps))), ps)
    assert sorted(j for c in chunks for j in c) == list(range(len(ps)))
    for c in chunks:
        rows, cols = max(ps[j].mcuy for j in c), max(ps[j].mcux for j in c)
        assert len(c) == 1 or rows * cols * len(c) <= 1.3 * sum(ps[j].mcuy * ps[j].mcux for j in c)
    assert any(len(c) > 1 for c in chunks)
    assert_pillow_pixels(blobs, decode_jpeg(blobs, "cpu"))


def test_a_batch_of_large_images_is_cut_into_canvases_of_bounded_size(monkeypatch):
    """The pixel stage's work space grows with its canvas; a batch of same-size photos
    (one canvas by the waste rule alone) is cut at CANVAS_PIXELS, pixels unchanged."""
    from pcrfs.torch import jpeg as tj
    blobs = [save(Image.fromarray(photo_like(200, 150, i)), quality=90, progressive=True)
             for i in range(7)]
    ps = [cjpeg.parse(b) for b in blobs]
    cap = 3 * 208 * 160                        # three images' padded pixels (4:2:0 MCUs)
    assert len(tj.canvases(list(range(7)), ps)) == 1
    chunks = tj.canvases(list(range(7)), ps, max_pixels=cap)
    assert sorted(j for c in chunks for j in c) == list(range(7))
    assert [len(c) for c in chunks] == [3, 3, 1]
    assert tj.canvases([0, 1], ps, max_pixels=10) == [[0], [1]]   # alone when over the cap
    monkeypatch.setattr(tj, "CANVAS_PIXELS", cap)
    got = decode_jpeg_canvases(blobs, "cpu")
    assert [len(m) for m, _, _, _ in got] == [3, 3, 1]
    assert all(c.shape[0] * c.shape[2] * c.shape[3] <= cap for _, c, _, _ in got)
    assert_pillow_pixels(blobs, decode_jpeg(blobs, "cpu"))


def _smooth_rows_loop(hib: int, v: int, total_rows: int, bh: int) -> np.ndarray:
    """jdcoefct.c's row choice for block smoothing, written as its loops run (the reference
    for the batched smooth_rows)."""
    out = np.tile(np.arange(bh)[:, None], (1, 5))
    for mrow in range(total_rows):
        rows = v if mrow < total_rows - 1 else (hib % v or v)
        image_rows = rows * total_rows
        for br in range(rows):
            r = mrow * v + br
            if r >= bh:
                continue
            ibr = mrow * rows + br
            prev = r - 1 if ibr > 0 else r
            pprev = r - 2 if ibr > 1 else prev
            nxt = r + 1 if ibr < image_rows - 1 else r
            nnxt = r + 2 if ibr < image_rows - 2 else nxt
            out[r] = (pprev, prev, r, nxt, nnxt)
    return np.clip(out, 0, bh - 1)


def test_batched_smoothing_rows_equal_the_loops():
    """Every (rows in blocks, sampling factor, iMCU rows) up to 6 iMCU rows, on canvases
    taller than the image as well as exact: the last iMCU row's own count and the rows
    past the image keep libjpeg's choices."""
    from pcrfs.torch import jpeg_pixels as px
    cases = [(hib, v, t) for v in (1, 2, 3, 4) for t in range(1, 7)
             for hib in range((t - 1) * v + 1, t * v + 1)]
    hib, v, t = (torch.tensor(c) for c in zip(*cases, strict=True))
    for bh in (1, 2, 5, 9, 16, 30):
        got = px.smooth_rows(hib, v, t, bh).numpy()
        for j, c in enumerate(cases):
            assert (got[j] == _smooth_rows_loop(*c, bh)).all(), (c, bh)
