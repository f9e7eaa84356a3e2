"""Image type and dimensions from the first bytes of an image, without decoding the whole image.

This runs on every image of every request (some are 10 MB of base64), so it only ever decodes the
few windows of base64 it needs: the first 64 characters for PNG, GIF, WebP and BMP, and for JPEG
a small window per segment header while it hops over segments by their length.
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

__all__ = ["SNIFF_CHARS", "SNIFF_FIRST", "ImageInfo", "sniff_base64", "sniff_bytes", "sniff_media"]


@dataclass(frozen=True, slots=True)
class ImageInfo:
    """What the magic bytes say: the real type (not the declared one) and the pixel size."""

    mime: str
    width: int | None
    height: int | None


# A reader returns up to n bytes at a byte offset (fewer at the end of the data or where the
# base64 turns invalid). The parsers below only ever see a reader, so bytes and base64 share them.
_Reader = Callable[[int, int], bytes]

_HEAD = 48  # bytes every non-JPEG header fits in (= 64 base64 chars)
_WINDOW = 768  # bytes decoded per JPEG/HEIF window: many segment headers per decode
_MAX_JPEG_STEPS = 4096  # markers + fill bytes walked before giving up (garbage never loops long)
_MAX_BOX_SCAN = 65536  # bytes of an ISO-BMFF file searched for the `meta` box and its `ispe`


def sniff_bytes(raw: bytes) -> ImageInfo | None:
    """Mime and dimensions of raw image bytes; None when they are not a recognised image."""
    try:
        mv = memoryview(raw)
        return _sniff(lambda off, n: bytes(mv[off : off + n]) if off >= 0 else b"")
    except Exception:  # noqa: BLE001 - promised never to raise on any input
        return None


def sniff_base64(data: str) -> ImageInfo | None:
    """Mime and dimensions from base64 text, decoding only the windows it needs.

    Accepts the standard and urlsafe alphabets, embedded whitespace (MIME line breaks) and missing
    padding. None when the bytes are not a recognised image; never raises.
    """
    try:
        if not isinstance(data, str) or not data:
            return None
        return _sniff(_B64Reader(data).read)
    except Exception:  # noqa: BLE001 - promised never to raise on any input
        return None


class _Base64Media(Protocol):
    def base64_prefix(self, chars: int) -> str: ...


# Base64 read to find a media's image size: PNG, GIF and WebP say it in the first bytes; a JPEG's frame
# header may sit past a large EXIF block, and only then is the longer prefix copied.
SNIFF_FIRST = 4096
SNIFF_CHARS = 256 * 1024


def sniff_media(media: _Base64Media) -> ImageInfo | None:
    """Mime and dimensions of a request's image (a formats.Media) from its base64, copying a prefix only;
    None for remote media and what is not a recognised image. Never raises."""
    first = media.base64_prefix(SNIFF_FIRST)
    info = sniff_base64(first)
    if info is not None and info.width is None and len(first) == SNIFF_FIRST:
        info = sniff_base64(media.base64_prefix(SNIFF_CHARS)) or info
    return info


# --- base64 windows ---------------------------------------------------------------------------

_B64_RUN = re.compile(r"[A-Za-z0-9+/]*")
_WHITESPACE = (" ", "\n", "\r", "\t", "\f", "\v")


def _b64decode_window(chunk: str) -> bytes:
    """Decode a 4-aligned window, stopping at the first character outside the alphabet."""
    # str.replace, not str.translate: translate costs ~10 us even on 64 chars.
    if "-" in chunk or "_" in chunk:
        chunk = chunk.replace("-", "+").replace("_", "/")
    end = _B64_RUN.match(chunk).end()  # type: ignore[union-attr]  # `*` always matches
    if end < len(chunk):
        chunk = chunk[:end]  # padding, garbage or a cut: everything after it is unreadable
    rem = len(chunk) % 4
    if rem == 1:
        chunk = chunk[:-1]  # a lone sextet carries no whole byte
    elif rem:
        chunk += "=" * (4 - rem)  # missing padding
    return binascii.a2b_base64(chunk)


class _B64Reader:
    """Random access to the bytes behind base64 text: byte offset o sits at char (o // 3) * 4.

    That mapping only holds without whitespace, so the text is checked for whitespace up to the
    furthest char asked for (str.find runs at memchr speed); once any turns up, reads go through a
    whitespace-free copy of just the needed prefix, grown on demand.
    """

    __slots__ = ("_buf", "_buf_at", "_clean", "_clean_from", "_s", "_verified")

    def __init__(self, s: str) -> None:
        self._s = s
        self._verified = 0  # s[:_verified] has no whitespace
        self._clean: str | None = None  # whitespace-free prefix, once whitespace was seen
        self._clean_from = 0  # how many chars of s went into _clean
        self._buf = b""
        self._buf_at = 0  # byte offset of _buf

    def read(self, offset: int, n: int) -> bytes:
        if offset < 0 or n <= 0:
            return b""
        at, buf = self._buf_at, self._buf
        if at <= offset and offset + n <= at + len(buf):
            return buf[offset - at : offset - at + n]
        # The first read is the 48-byte header; later (JPEG/HEIF) reads take a larger window.
        want = max(n, _WINDOW if offset or n > _HEAD else _HEAD)
        quad = offset // 3
        end = -(-(offset + want) // 3) * 4
        buf = _b64decode_window(self._chars(quad * 4, end))
        self._buf, self._buf_at = buf, quad * 3
        skip = offset - quad * 3
        return buf[skip : skip + n]

    def _chars(self, start: int, end: int) -> str:
        s = self._s
        if self._clean is None:
            hi = min(end, len(s))
            if hi > self._verified:
                lo = self._verified
                if any(s.find(w, lo, hi) >= 0 for w in _WHITESPACE):
                    self._clean = ""
                else:
                    self._verified = hi
            if self._clean is None:
                return s[start:end]
        clean = self._clean
        while len(clean) < end and self._clean_from < len(s):
            # MIME wraps 76 chars + CRLF, so ~3% over the need usually suffices; else keep doubling.
            take = max(end + end // 16 + 64, 2 * self._clean_from)
            clean = "".join(s[:take].split())
            self._clean_from = min(take, len(s))
        self._clean = clean
        return clean[start:end]


# --- formats ------------------------------------------------------------------------------------


def _u16be(b: bytes, i: int) -> int:
    return (b[i] << 8) | b[i + 1]


def _u16le(b: bytes, i: int) -> int:
    return b[i] | (b[i + 1] << 8)


def _u24le(b: bytes, i: int) -> int:
    return b[i] | (b[i + 1] << 8) | (b[i + 2] << 16)


def _u32be(b: bytes, i: int) -> int:
    return int.from_bytes(b[i : i + 4], "big")


def _dim(v: int) -> int | None:
    # Zero is never a real size (and JPEG uses height 0 for "given later by DNL").
    return v if v > 0 else None


def _sniff(read: _Reader) -> ImageInfo | None:
    head = read(0, _HEAD)
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return _png(head)
    if head.startswith(b"\xff\xd8\xff"):
        return _jpeg(read)
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return _gif(head)
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return _webp(head)
    if head[:2] == b"BM":
        return _bmp(head)
    if head[4:8] == b"ftyp":
        return _isobmff(head, read)
    return None


def _png(b: bytes) -> ImageInfo:
    # IHDR must be the first chunk: length(4) "IHDR" width(4) height(4), big-endian.
    if len(b) < 24 or b[12:16] != b"IHDR":
        return ImageInfo("image/png", None, None)
    return ImageInfo("image/png", _dim(_u32be(b, 16)), _dim(_u32be(b, 20)))


def _gif(b: bytes) -> ImageInfo:
    # Logical screen descriptor right after the signature; frames can't exceed it in practice.
    if len(b) < 10:
        return ImageInfo("image/gif", None, None)
    return ImageInfo("image/gif", _dim(_u16le(b, 6)), _dim(_u16le(b, 8)))


def _webp(b: bytes) -> ImageInfo | None:
    kind = b[12:16]
    if kind == b"VP8 " and len(b) >= 30:
        # Lossy: 3-byte frame tag, start code 9d 01 2a, then 14-bit width/height (+2 scale bits).
        if b[23:26] == b"\x9d\x01\x2a":
            return ImageInfo("image/webp", _dim(_u16le(b, 26) & 0x3FFF), _dim(_u16le(b, 28) & 0x3FFF))
    elif kind == b"VP8L" and len(b) >= 25:
        # Lossless: signature 0x2f, then width-1 and height-1 as two 14-bit little-endian fields.
        if b[20] == 0x2F:
            bits = int.from_bytes(b[21:25], "little")
            return ImageInfo("image/webp", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    elif kind == b"VP8X" and len(b) >= 30:
        # Extended (alpha, animation, metadata): flags(1) reserved(3), canvas width-1 and
        # height-1 as 24-bit little-endian.
        return ImageInfo("image/webp", _u24le(b, 24) + 1, _u24le(b, 27) + 1)
    return ImageInfo("image/webp", None, None)


_BMP_HEADERS = frozenset({12, 16, 40, 52, 56, 64, 108, 124})


def _bmp(b: bytes) -> ImageInfo | None:
    # "BM" alone is a weak magic (base64 "Qk..."), so also require a known DIB header size.
    if len(b) < 26:
        return None
    size = int.from_bytes(b[14:18], "little")
    if size not in _BMP_HEADERS:
        return None
    if size == 12:  # OS/2 BITMAPCOREHEADER: 16-bit unsigned sizes
        return ImageInfo("image/bmp", _dim(_u16le(b, 18)), _dim(_u16le(b, 20)))
    w = int.from_bytes(b[18:22], "little", signed=True)
    h = int.from_bytes(b[22:26], "little", signed=True)
    return ImageInfo("image/bmp", _dim(abs(w)), _dim(abs(h)))  # negative height = top-down rows


# JPEG markers. SOF0..SOF15 are C0..CF except C4 (DHT), C8 (JPG extension) and CC (DAC).
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Markers without a length field: TEM, RST0..RST7, SOI. (Outside a scan RSTn is an encoder bug,
# but skipping it is harmless and matches what decoders tolerate.)
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD9)})


def _jpeg(read: _Reader) -> ImageInfo:
    """Walk the segments from SOI to the first SOFn, hopping over each by its length.

    A large EXIF/ICC block before SOF costs one extra window decode, not a decode of the block.
    A JPEG whose SOF can't be reached (truncated, corrupt) is still a JPEG: dims are None.
    """
    pos = 2
    for _ in range(_MAX_JPEG_STEPS):
        b = read(pos, 1)
        if not b or b[0] != 0xFF:
            break  # truncated, or junk where a marker should be
        pos += 1
        marker = read(pos, 1)
        if not marker:
            break
        m = marker[0]
        pos += 1
        if m == 0xFF:
            pos -= 1  # fill byte: the next 0xFF starts the marker again
            continue
        if m in _STANDALONE:
            continue
        if m in (0x00, 0xD9, 0xDA):
            break  # stuffed byte, EOI, or start of scan before any SOF: no size to find
        seg = read(pos, 7)
        if len(seg) < 2:
            break
        length = _u16be(seg, 0)
        if length < 2:
            break
        if m in _SOF:
            if len(seg) < 7:
                break
            # length(2) precision(1) height(2) width(2)
            return ImageInfo("image/jpeg", _dim(_u16be(seg, 5)), _dim(_u16be(seg, 3)))
        pos += length
    return ImageInfo("image/jpeg", None, None)


_HEIC_BRANDS = frozenset({b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx"})
_AVIF_BRANDS = frozenset({b"avif", b"avis"})


def _isobmff(head: bytes, read: _Reader) -> ImageInfo | None:
    """HEIC/AVIF: type from the ftyp brands, size from the largest `ispe` inside `meta`.

    Every image item (including a grid's full-size output item) carries an `ispe` property and
    thumbnails/tiles are smaller, so the largest one is the picture's size. Best effort: dims are
    None when `meta` sits beyond the first 64 KB.
    """
    ftyp_size = _u32be(head, 0)
    ftyp = read(0, min(max(ftyp_size, 16), 256))
    brands = {ftyp[i : i + 4] for i in range(8, len(ftyp) - 3, 4) if i != 12}  # 12: minor version
    if brands & _AVIF_BRANDS:
        mime = "image/avif"
    elif brands & _HEIC_BRANDS:
        mime = "image/heic"
    else:
        return None  # mp4/mov/3gp video or other ISO-BMFF: not an image
    pos = 0
    while pos < _MAX_BOX_SCAN:
        box = read(pos, 16)
        if len(box) < 8:
            break
        size, kind = _u32be(box, 0), box[4:8]
        header = 8
        if size == 1 and len(box) >= 16:
            size, header = int.from_bytes(box[8:16], "big"), 16
        elif size == 0:
            size = _MAX_BOX_SCAN  # box runs to the end of the file
        if size < header:
            break
        if kind == b"meta":
            return ImageInfo(mime, *_largest_ispe(read(pos + header, min(size - header, _MAX_BOX_SCAN))))
        pos += size
    return ImageInfo(mime, None, None)


def _largest_ispe(meta: bytes) -> tuple[int | None, int | None]:
    best: tuple[int, int] | None = None
    i = meta.find(b"ispe")
    while i >= 0:
        # size(4) "ispe" version+flags(4) width(4) height(4): a real ispe box is exactly 20 bytes.
        if i >= 4 and i + 16 <= len(meta) and _u32be(meta, i - 4) == 20:
            w, h = _u32be(meta, i + 8), _u32be(meta, i + 12)
            if best is None or w * h > best[0] * best[1]:
                best = (w, h)
        i = meta.find(b"ispe", i + 4)
    if best is None:
        return None, None
    return _dim(best[0]), _dim(best[1])
