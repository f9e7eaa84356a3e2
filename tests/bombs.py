"""Hostile payloads for tests: compression bombs of gigabytes, built without inflating them, a pixel bomb's PNG header,
and blank PNGs of up to 100 megapixels whose pixels decode to gigabytes."""

from __future__ import annotations

import struct
import zlib

import zstandard

GiB = 1024**3
MiB = 1024**2


def _zero_block(size: int) -> bytes:
    """Raw deflate of `size` zeros ending on a full flush: byte-aligned, no back-references out of it,
    so copies of it concatenate into one valid deflate stream."""
    c = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    return c.compress(bytes(size)) + c.flush(zlib.Z_FULL_FLUSH)


class _Crc:
    """CRC-32 as an affine map over GF(2) on the 32-bit state, to get the CRC of gigabytes of zeros by
    squaring the map of one zero byte instead of hashing them (zlib's crc32_combine, in Python)."""

    def __init__(self, const: int, cols: list[int]) -> None:
        self.const, self.cols = const, cols

    @classmethod
    def zeros(cls, n: int) -> _Crc:
        one = cls(zlib.crc32(b"\0", 0), [zlib.crc32(b"\0", 1 << i) ^ zlib.crc32(b"\0", 0) for i in range(32)])
        result = cls(0, [1 << i for i in range(32)])  # the identity
        while n:
            if n & 1:
                result = result.then(one)
            one = one.then(one)
            n >>= 1
        return result

    def __call__(self, state: int) -> int:
        out = self.const
        for i in range(32):
            if state >> i & 1:
                out ^= self.cols[i]
        return out

    def then(self, other: _Crc) -> _Crc:
        """Apply self, then other."""
        return _Crc(other(self.const), [other(c) ^ other.const for c in self.cols])


def gzip_bomb(inflated: int, block: int = 16 * MiB) -> bytes:
    """A valid gzip body of about inflated/1000 bytes that inflates to `inflated` zero bytes (a multiple of `block`)."""
    assert inflated % block == 0
    body = _zero_block(block) * (inflated // block) + b"\x03\x00"  # a final empty fixed-Huffman block
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    return header + body + struct.pack("<II", _Crc.zeros(inflated)(0), inflated & 0xFFFFFFFF)


def deflate_bomb(inflated: int, block: int = 16 * MiB) -> bytes:
    """The same as raw deflate, as `Content-Encoding: deflate` without the zlib header sends it."""
    return _zero_block(block) * (inflated // block) + b"\x03\x00"


def zstd_bomb(inflated: int) -> bytes:
    """A zstd frame of `inflated` zeros that does not declare its size (as a streaming compressor writes it)."""
    c = zstandard.ZstdCompressor(level=3, write_content_size=False).compressobj()
    chunk = bytes(16 * MiB)
    return b"".join(c.compress(chunk) for _ in range(inflated // len(chunk))) + c.flush()


_BANDS = {0: 1, 2: 3, 4: 2, 6: 4}  # PNG colour type -> samples per pixel (grey, RGB, grey+alpha, RGBA)


def _png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def blank_png(width: int, height: int, color_type: int = 6) -> bytes:
    """A valid PNG of `width` x `height` all-zero pixels (RGBA by default: transparent black), about a thousandth of
    its decoded size: the image stream is all zeros (filter 0 on zero pixels), written as copies of one deflate block,
    so 100 megapixels (400 MB of RGBA) take a fraction of a second and 400 KB."""
    zeros = height * (1 + width * _BANDS[color_type])
    block = 16 * MiB
    stream = _zero_block(block) * (zeros // block) + (_zero_block(zeros % block) if zeros % block else b"") + b"\x03\x00"
    adler = (zeros % 65521) << 16 | 1  # Adler-32 of zeros: a stays 1, b counts them
    idat = b"\x78\xda" + stream + struct.pack(">I", adler)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b"")


def png_header(width: int, height: int, color_type: int = 2) -> bytes:
    """A PNG that claims a size in IHDR and holds one tiny row: a decompression bomb's header (RGB, or 0: grey)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
