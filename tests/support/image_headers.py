"""Images that are headers and little else (issue 31): a PNG, GIF or BMP that says it is W×H pixels in
a few dozen bytes. A server that reads the header before decoding refuses what is too large at once;
one that decodes first spends seconds and gigabytes, or fails on the missing pixels.

- `header(fmt, width, height)`: the bytes; `data_url(...)` the same as a data URL.
- `large_headers()`: a hypothesis strategy of (format, width, height), from 1×1 to 65,535 a side.
"""

from __future__ import annotations

import base64
import struct
import zlib

from hypothesis import strategies as st

FORMATS = ("png", "gif", "bmp")
MIME = {"png": "image/png", "gif": "image/gif", "bmp": "image/bmp"}


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def header(fmt: str, width: int, height: int) -> bytes:
    if fmt == "png":  # IHDR, and one small IDAT: pillow opens a PNG once it sees image data
        ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
        return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(b"\x00" * 16))
    if fmt == "gif":  # the logical screen and one image descriptor of the same size
        return (b"GIF89a" + struct.pack("<HHBBB", width, height, 0, 0, 0) + b"\x2c"
                + struct.pack("<HHHHB", 0, 0, width, height, 0) + b"\x02\x02\x44\x01\x00\x3b")
    if fmt == "bmp":  # BITMAPINFOHEADER, 24 bits, 16 bytes of pixels
        info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0, 0, 2835, 2835, 0, 0)
        return b"BM" + struct.pack("<IHHI", 54 + 16, 0, 0, 54) + info + b"\x00" * 16
    raise ValueError(fmt)


def data_url(fmt: str, width: int, height: int) -> str:
    return f"data:{MIME[fmt]};base64," + base64.b64encode(header(fmt, width, height)).decode()


def large_headers() -> st.SearchStrategy:
    side = st.one_of(st.integers(1, 65_535), st.sampled_from([1, 64, 4_096, 5_792, 8_192, 16_384, 65_535]))
    return st.tuples(st.sampled_from(FORMATS), side, side)
