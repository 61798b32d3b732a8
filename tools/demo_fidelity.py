#!/usr/bin/env python3
"""Decode one image of a mounted dataset at several fidelities and put the results side
by side in a PNG, with the bytes each one read."""
import argparse
import os

from PIL import Image, ImageDraw


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("mnt")
    p.add_argument("out", help="PNG to write")
    p.add_argument("--views", default="q1,q2,q5,max")
    p.add_argument("--width", type=int, default=320)
    a = p.parse_args()
    views = sorted((v for v in os.listdir(a.mnt) if v.startswith("q")), key=lambda v: int(v[1:]))
    wanted = [views[-1] if v == "max" else v for v in a.views.split(",")]
    top = os.path.join(a.mnt, views[-1])
    rel = None
    for dirpath, _, files in sorted(os.walk(top)):
        if files:
            rel = os.path.relpath(os.path.join(dirpath, sorted(files)[0]), top)
            break
    tiles, full = [], os.path.getsize(os.path.join(top, rel))
    for v in wanted:
        path = os.path.join(a.mnt, v, rel)
        size = os.path.getsize(path)
        with Image.open(path) as im:
            im = im.convert("RGB")
            im.thumbnail((a.width, a.width))
        label = f"{v}: {size:,} B ({100 * size / full:.0f}%)"
        print(f"  {label:40s} saves {full - size:,} bytes vs {views[-1]}")
        tiles.append((im, label))
    h = max(t.height for t, _ in tiles) + 24
    sheet = Image.new("RGB", (sum(t.width for t, _ in tiles) + 8 * (len(tiles) - 1), h), "white")
    x = 0
    for t, label in tiles:
        sheet.paste(t, (x, 24))
        ImageDraw.Draw(sheet).text((x + 4, 6), label, fill="black")
        x += t.width + 8
    sheet.save(a.out)
    print(f"{rel} at {', '.join(wanted)} -> {a.out}")


if __name__ == "__main__":
    main()
