"""Pillow plugin: `import pcrfs.l3`, then Image.open() reads .l3 files as RGB images."""
from __future__ import annotations

import struct

from PIL import Image, ImageFile

import pcrfs.l3 as l3


def _accept(prefix: bytes) -> bool:
    return prefix[:4] == l3.MAGIC


class L3ImageFile(ImageFile.ImageFile):
    format = "L3"
    format_description = "L3 lossless (GPU-decodable) image"

    def _open(self) -> None:
        head = self.fp.read(l3.HEADER_SIZE)
        if len(head) < l3.HEADER_SIZE or not _accept(head):
            raise SyntaxError("not an L3 file")
        w, h, n = struct.unpack_from("<IIB", head, 4)
        if not (w and h and 1 <= n <= l3.MAX_PATCH):
            raise SyntaxError(f"bad L3 header: {w}x{h}, patch {n}")
        self._mode = "RGB"
        self._size = (w, h)
        self.info["l3_patch"] = n
        self.tile = [ImageFile._Tile("l3", (0, 0, w, h), 0, None)]


class L3Decoder(ImageFile.PyDecoder):
    _pulls_fd = True

    def decode(self, buffer):
        self.fd.seek(0)
        pixels = l3.decode(self.fd.read())
        self.set_as_raw(pixels.tobytes())
        return -1, 0


Image.register_open(L3ImageFile.format, L3ImageFile, _accept)
Image.register_decoder("l3", L3Decoder)
Image.register_extension(L3ImageFile.format, ".l3")
Image.register_mime(L3ImageFile.format, "image/x-l3")
