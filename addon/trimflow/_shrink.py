"""Bring one image under per-image limits: decode, downscale, re-encode; deterministic and cached.

The engine calls `shrink` only for an image whose header already shows it is over a limit (or
that it thins to a thumbnail), so the common request never decodes an image at all.

The ladder, for a long side limit `max_side` and a base64 length limit `max_bytes`:
- Fit the long side under `max_side` (aspect ratio kept, LANCZOS); JPEGs are decoded at a reduced
  DCT scale first when that is still at least the target size (much faster, same result size).
- At that size try the source's own format, then the lossy steps: JPEG and WebP at quality 85, 70,
  55; PNG (and GIF/BMP, which become PNG: GIF's first frame, since Gemini takes no GIF and BMP no
  provider) as PNG, then as JPEG at 85, 70, 55. JPEG, not WebP, is the fallback for PNG because
  every provider and local runtime (Ollama, llama.cpp) decodes it; transparency is flattened onto
  white. A PNG over the byte limit at its own size skips the PNG step (lossless again at the same
  size rarely gains much, and it is the slowest encode). Quality steps stop early when the first
  is more than twice the limit.
- Still too big: step the long side down by 0.75 per rung, skipping as many rungs as the byte
  count says are needed (bytes ~ pixels), down to a 16 px long side; then give up with a reason.

Determinism: fixed encoder settings (PNG's zlib level is picked from the input alone, see
PNG_LEVEL) and no metadata at all (EXIF, ICC, text chunks and timestamps are dropped; EXIF
orientation is applied to the pixels first), so the same input bytes and limits give the same
output bytes every time with a given Pillow build. That keeps a
provider's prompt cache valid across turns; the cache below makes it cheap.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass

from PIL import Image, ImageOps, UnidentifiedImageError

from ._imageinfo import ImageInfo, sniff_bytes
from ._sizes import format_size

__all__ = ["CACHE", "MAX_PIXELS", "ShrinkCache", "Shrunk", "shrink"]

# Refuse to decode anything bigger: 100 MP of RGBA is 400 MB of memory. Pillow's own bomb check
# (a warning above MAX_IMAGE_PIXELS, an error above twice that) is aligned with it as a backstop for
# headers the sniffer can't read; our check runs on the header before Pillow opens anything.
MAX_PIXELS = 100_000_000
Image.MAX_IMAGE_PIXELS = MAX_PIXELS

QUALITIES = (85, 70, 55)
SCALE_STEP = 0.75
MIN_SIDE = 16
DEFAULT_CACHE_BYTES = 256 * 2**20
# zlib level for PNG output. 6 (zlib's default) suits screenshots: text and flat areas shrink well
# and it is as fast as level 1 there. Photo-like or noisy PNG sources (over 1 byte per pixel as
# they came) gain ~15% from it at up to 10x the time, so those get level 1: a proxy must not stall.
PNG_LEVEL, PNG_LEVEL_DENSE, DENSE_BYTES_PER_PIXEL = 6, 1, 1.0

# Only these decoders are ever used: no EPS (which runs Ghostscript), TIFF, PSD or the like.
_DECODERS = ("PNG", "JPEG", "GIF", "WEBP", "BMP")
_MIME = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}
# What to try at each size, by the source's format: (format, quality or None for lossless).
_LADDER: dict[str, tuple[tuple[str, int | None], ...]] = {
    "PNG": (("PNG", None), *(("JPEG", q) for q in QUALITIES)),
    "JPEG": tuple(("JPEG", q) for q in QUALITIES),
    "WEBP": tuple(("WEBP", q) for q in QUALITIES),
}
_LADDER["GIF"] = _LADDER["BMP"] = _LADDER["PNG"]
# Formats every provider takes as they are: an image within its limits in one of them is left alone.
_ACCEPTED = ("PNG", "JPEG", "WEBP", "GIF")
_ORIENTATION = 0x0112  # the EXIF tag
_QUARTER_TURNS = (5, 6, 7, 8)  # orientations that swap width and height
_ENTRY_OVERHEAD = 128  # bytes a cache entry costs beyond its base64 text (key, object headers)


@dataclass(frozen=True, slots=True)
class Shrunk:
    """The outcome for one image.

    `data` is set when the image was re-encoded to meet the limits; `reason` when it cannot be
    (the placeholder text says why); neither when it already meets them as it is.
    """

    data: str | None = None  # base64 of the new image, no data URL prefix
    mime: str | None = None
    width: int | None = None
    height: int | None = None
    reason: str | None = None

    @property
    def info(self) -> ImageInfo | None:
        return None if self.mime is None else ImageInfo(self.mime, self.width, self.height)


class ShrinkCache:
    """A thread-safe LRU of results by content hash, bounded by the bytes of base64 it holds."""

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[bytes, Shrunk] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: bytes) -> Shrunk | None:
        with self._lock:
            value = self._entries.get(key)
            if value is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: bytes, value: Shrunk) -> None:
        cost = _cost(value)
        if cost > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= _cost(old)
            self._entries[key] = value
            self._bytes += cost
            while self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= _cost(evicted)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0
            self.hits = self.misses = 0

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)


def _cost(value: Shrunk) -> int:
    return _ENTRY_OVERHEAD + (len(value.data) if value.data is not None else 0)


# The process-wide cache the engine uses (worker threads share it).
CACHE = ShrinkCache()


def cache_key(payload: str, max_side: int | None, max_bytes: int | None) -> bytes:
    digest = hashlib.blake2b(f"{max_side}:{max_bytes}:".encode(), digest_size=32)
    digest.update(payload.encode("utf-8", "surrogatepass"))
    return digest.digest()


def shrink(payload: str, *, max_side: int | None, max_bytes: int | None, cache: ShrinkCache | None = None) -> Shrunk:
    """The image in base64 `payload` with its long side <= `max_side` and base64 length <= `max_bytes`.

    None means no limit. Never raises: anything that goes wrong is a Shrunk with a reason.
    """
    cache = CACHE if cache is None else cache
    key = cache_key(payload, max_side, max_bytes)
    hit = cache.get(key)
    if hit is not None:
        return hit
    try:
        result = _shrink(payload, max_side, max_bytes)
    except Exception as exc:  # noqa: BLE001 - a broken image is dropped, never a broken request
        result = Shrunk(reason=f"could not be re-encoded ({type(exc).__name__})")
    cache.put(key, result)
    return result


def _shrink(payload: str, max_side: int | None, max_bytes: int | None) -> Shrunk:
    raw = _b64decode(payload)
    if raw is None:
        return Shrunk(reason="not valid base64")
    head = sniff_bytes(raw)
    if head is not None and head.width and head.height and head.width * head.height > MAX_PIXELS:
        return Shrunk(reason=_too_many_pixels(head.width, head.height))
    try:
        im = Image.open(io.BytesIO(raw), formats=_DECODERS)
    except Image.DecompressionBombError:
        return Shrunk(reason=f"over the {MAX_PIXELS // 1_000_000}-megapixel decoding limit")
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        return Shrunk(reason="could not be decoded")
    # No `with`: closing would also free the pixels; the BytesIO holds no OS resource.
    width, height = im.size
    if width * height > MAX_PIXELS:
        return Shrunk(reason=_too_many_pixels(width, height))
    source = im.format or "PNG"
    fits_side = max_side is None or max(width, height) <= max_side
    fits_bytes = max_bytes is None or len(payload) <= max_bytes
    if fits_side and fits_bytes and source in _ACCEPTED:
        return Shrunk()
    long_side = max(width, height)
    if max_side is not None:
        long_side = min(long_side, max_side)
    if source == "JPEG" and long_side < max(width, height):
        # Decode at 1/2, 1/4 or 1/8 scale when that still covers the target: 4-60x less work.
        im.draft(None, _fit(width, height, long_side))
    try:
        im.load()
    except (OSError, ValueError, SyntaxError):
        return Shrunk(reason="could not be decoded")
    if im.getexif().get(_ORIENTATION, 1) in _QUARTER_TURNS:
        width, height = height, width  # the pixels are turned upright below
    pixels = _normalize(im)
    dense = source == "PNG" and len(raw) > DENSE_BYTES_PER_PIXEL * width * height  # (BMP is never compressed)
    png_level = PNG_LEVEL_DENSE if dense else PNG_LEVEL
    return _ladder(pixels, source, width, height, long_side, max_bytes, png_level)


def _too_many_pixels(width: int, height: int) -> str:
    return f"{width}x{height} is over the {MAX_PIXELS // 1_000_000}-megapixel decoding limit"


def _b64decode(payload: str) -> bytes | None:
    text = payload
    if any(c in text for c in (" ", "\n", "\r", "\t")):
        text = "".join(text.split())
    if "-" in text or "_" in text:
        text = text.replace("-", "+").replace("_", "/")
    text = text.rstrip("=")
    if len(text) % 4 == 1:
        return None
    try:
        return binascii.a2b_base64(text + "=" * (-len(text) % 4), strict_mode=True)
    except (binascii.Error, ValueError):
        return None


def _normalize(im: Image.Image) -> Image.Image:
    """Pixels ready to resize and encode: upright, in L/LA/RGB/RGBA, with no metadata."""
    if im.getexif().get(_ORIENTATION, 1) != 1:  # the metadata goes, so apply it to the pixels
        im = ImageOps.exif_transpose(im)
    transparent = "transparency" in im.info
    if im.mode in ("RGBA", "LA", "PA") or transparent:
        out = im.convert("LA" if im.mode in ("L", "LA") and not transparent else "RGBA")
        if out.getchannel("A").getextrema() == (255, 255):
            out = out.convert("L" if out.mode == "LA" else "RGB")  # alpha that hides nothing
    elif im.mode in ("L", "RGB"):
        out = im
    elif im.mode == "1":
        out = im.convert("L")
    else:  # P, CMYK, YCbCr, I;16, ...
        out = im.convert("RGB")
    out.info = {}
    return out


def _fit(width: int, height: int, long_side: int) -> tuple[int, int]:
    """The size with the long side `long_side`, aspect ratio kept (never below 1 px)."""
    if width >= height:
        return long_side, max(1, round(height * long_side / width))
    return max(1, round(width * long_side / height)), long_side


def _ladder(im: Image.Image, source: str, width: int, height: int, long_side: int, max_bytes: int | None, png_level: int) -> Shrunk:
    steps = _LADDER[source]
    while long_side >= MIN_SIDE:
        size = _fit(width, height, long_side)
        frame = im if im.size == size else im.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)
        frame.info = {}
        flat: Image.Image | None = None
        smallest: int | None = None
        for fmt, quality in steps:
            if fmt == source == "PNG" and size == (width, height):
                continue  # lossless again at the same size: zlib rarely beats what wrote it by much
            if fmt == "JPEG" and flat is None:
                flat = _flatten(frame)
            setting = png_level if fmt == "PNG" else quality
            data = _encode(flat if fmt == "JPEG" and flat is not None else frame, fmt, setting)
            length = 4 * -(-len(data) // 3)
            if max_bytes is None or length <= max_bytes:
                return Shrunk(base64.b64encode(data).decode("ascii"), _MIME[fmt], size[0], size[1])
            smallest = length if smallest is None else min(smallest, length)
            if fmt != "PNG" and length > 2 * max_bytes:
                break  # the lower qualities can't halve it: go down in size instead
        assert max_bytes is not None and smallest is not None
        # Bytes grow with pixels, so the area must shrink by about max_bytes / smallest:
        # skip the rungs of 0.75 that cannot get there anyway.
        rungs = max(1, math.ceil(math.log(max_bytes / smallest) / (2 * math.log(SCALE_STEP))))
        long_side = math.floor(long_side * SCALE_STEP**rungs)
    return Shrunk(reason=f"could not be shrunk under {format_size(max_bytes or 0)}")


def _flatten(im: Image.Image) -> Image.Image:
    """JPEG has no alpha: composite onto white."""
    if im.mode not in ("LA", "RGBA"):
        return im
    background = Image.new("RGB", im.size, (255, 255, 255))
    background.paste(im.convert("RGBA"), mask=im.getchannel("A"))
    return background


def _encode(im: Image.Image, fmt: str, setting: int | None) -> bytes:
    """Encode with fixed settings and no metadata; `setting` is the quality, or PNG's zlib level."""
    out = io.BytesIO()
    if fmt == "PNG":
        im.save(out, "PNG", compress_level=setting)
    elif fmt == "JPEG":
        im.save(out, "JPEG", quality=setting, subsampling="4:2:0", optimize=False, progressive=False)
    else:
        im.save(out, "WEBP", quality=setting, method=4)
    return out.getvalue()
