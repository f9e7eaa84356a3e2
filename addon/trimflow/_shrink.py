"""Bring one image under per-image limits: decode, downscale, re-encode; deterministic and cached.

The engine calls `shrink` only for an image whose header already shows it is over a limit (or
that it thins to a thumbnail), so the common request never decodes an image at all.

The ladder, for a long side limit `max_side` and a base64 length limit `max_bytes`, least lossy first
(docs/how-it-works.md has what each step buys on real-looking screenshots):
- The size: the long side fits under `max_side` (aspect ratio kept, LANCZOS), else the image keeps
  its dimensions. JPEGs are decoded at a reduced DCT scale first when that still covers the target.
- At that size, lossless first: a PNG within LOSSLESS_MARGIN of the byte limit is compressed again
  at zlib's level 9 (it gains about 2%, so only that close is it worth the time); a screenshot-like
  PNG (few bytes per pixel) then goes as lossless WebP where the target takes WebP (4-5x smaller
  than PNG on UI and code, the same pixels); where the target takes no WebP, such a PNG tries 256
  colours (PNG8: 2-3x smaller, text edges kept) instead. Then lossy: WebP where it is taken, else JPEG,
  at quality 90, 85, 70, 55 (WebP keeps text sharper than JPEG at every step and is smaller); a JPEG
  source stays JPEG, a WebP one WebP. JPEG,
  not WebP, where the target's runtimes may not decode WebP (`webp=False`: Ollama, llama.cpp behind
  OpenAI's chat format). A side-limited PNG or GIF/BMP (GIF's first frame, since Gemini takes no GIF
  and BMP no provider) tries PNG first. Transparency is flattened onto white for JPEG. Quality steps
  stop early when one is more than twice the limit.
- Only when nothing at that size fits: step the long side down by 0.75 per rung, skipping as many
  rungs as the byte count says are needed (bytes ~ pixels), down to a 16 px long side, with the
  same steps but the lossless ones; then give up with a reason.

The size the model sees (`size`, from trimflow._tokens.native_size): an image larger than it goes at exactly that
size (unless a side limit asks for less), losslessly: as lossless WebP where the target takes WebP, else PNG. The
original goes as it came when it is within the limits and that encoding is no smaller; an original over a limit
whose lossless encoding at that size is still over the byte limit goes down the ladder above from that size, with
the lossy steps the limit already allowed.

Memory: before decoding, `_open` works out from the header the most the image can hold at once
(`_peak_bytes`), and the shrink reserves that in the process-wide BUDGET (trimflow._pixel_budget): an
image that may need more than DECODE_BUDGET is refused, one that does not fit beside the others waits
its turn or is refused for this request. On a frame over MAX_HEAVY_PIXELS neither lossless WebP nor
256 colours is tried and the lossy format is JPEG (WebP's encoder takes ~40 bytes a pixel); 256
colours only on a frame of at most PALETTE_MAX_COLOURS colours.

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
import logging
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass

from PIL import Image, ImageOps, UnidentifiedImageError

from ._human import format_size
from ._imageinfo import ImageInfo, sniff_bytes
from ._limits import MIN_SIDE
from ._pixel_budget import PixelBudget

__all__ = ["BUDGET", "CACHE", "DECODE_BUDGET", "MAX_PIXELS", "ShrinkCache", "Shrunk", "open_image", "shrink"]

log = logging.getLogger("trimflow")

# Refuse to decode anything bigger: 100 MP of RGBA is 400 MB of memory. Pillow's own bomb check
# (a warning above MAX_IMAGE_PIXELS, an error above twice that) is aligned with it as a backstop for
# headers the sniffer can't read; our check runs on the header before Pillow opens anything.
MAX_PIXELS = 100_000_000
Image.MAX_IMAGE_PIXELS = MAX_PIXELS
# Pillow allocates an image's pixels in blocks, 16 MiB by default: under glibc's mmap threshold (32 MiB at most,
# see trimflow._malloc), so they come from a thread's heap, where freed ones stay in the process. Blocks over it
# are mapped and unmapped: a large image's pixels go back to the system as soon as they are freed.
PIXEL_BLOCK_BYTES = 64 * 2**20
Image.core.set_block_size(PIXEL_BLOCK_BYTES)

QUALITIES = (90, 85, 70, 55)
# A PNG this close over the byte limit is compressed again losslessly at level 9 first.
LOSSLESS_MARGIN = 1.05
# Lossless WebP only for a screenshot-like PNG (UI, text, code: under this many bytes per pixel as it came) within
# this factor of the limit: on photo-like pixels it gains little and costs seconds per megapixel.
LOSSLESS_WEBP_BYTES_PER_PIXEL, LOSSLESS_WEBP_REACH = 0.25, 4.0
SCALE_STEP = 0.75

# What all shrinks of the process may hold at once (trimflow._pixel_budget): each reserves the most its image
# can need (`_peak_bytes`, from the header) before decoding it. 1 GiB keeps the proxy under 2 GiB with its own
# memory and the bodies in flight; an image that would need more is never decoded.
DECODE_BUDGET = 2**30
DECODE_WAIT = 30.0  # seconds an image waits for room before it is refused for this request
DECODE_WAITING = 3  # images that may wait at once: each holds one of the event loop's few worker threads
GIVE_BACK_AFTER = 64 * 2**20  # decoding this much since the last time gives the freed memory back once idle
BUDGET = PixelBudget(DECODE_BUDGET, wait=DECODE_WAIT, max_waiting=DECODE_WAITING, give_back_after=GIVE_BACK_AFTER)
# libwebp's encoders take 40-45 bytes per pixel of the frame they encode (measured on noise): on a larger frame than
# this (a 5K screen is 14.7 MP) lossless WebP and 256 colours are not tried, and the lossy format is JPEG, so one
# image stays well within the budget.
MAX_HEAVY_PIXELS = 16_000_000
DEFAULT_CACHE_BYTES = 256 * 2**20
# zlib level for PNG output. 6 (zlib's default) suits screenshots: text and flat areas shrink well
# and it is as fast as level 1 there. Photo-like or noisy PNG sources (over 1 byte per pixel as
# they came) gain ~15% from it at up to 10x the time, so those get level 1: a proxy must not stall.
PNG_LEVEL, PNG_LEVEL_DENSE, DENSE_BYTES_PER_PIXEL = 6, 1, 1.0

# Only these decoders are ever used: no EPS (which runs Ghostscript), TIFF, PSD or the like.
_DECODERS = ("PNG", "JPEG", "GIF", "WEBP", "BMP")
_MIME = {"PNG": "image/png", "PNG8": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}
_PNG_LIKE = ("PNG", "GIF", "BMP")  # decoded to pixels that PNG keeps exactly
LOSSLESS = -1  # the quality setting that asks WebP for its lossless mode
# Its lossless mode at less effort, for the size the model sees: the new screenshot of every computer-use turn waits
# for its encoding, and on photo-like pixels this takes a third less CPU for at most a few per cent more bytes (on
# flat UI and code, the same bytes). The least effort would double the bytes of a flat screen.
LOSSLESS_QUICK = -2
# Its lossless mode for an image that goes up once (send_once) and is referenced after: the bytes are paid once, the
# encoding on the turn that brings it. The least effort first, a fifth of the CPU on photo-like pixels for 10-30% more
# bytes; a frame that comes out under ONCE_FLAT_BYTES_PER_PIXEL (flat UI, code) is encoded again at LOSSLESS_QUICK,
# which is cheap there and up to half the bytes, and the smaller kept.
LOSSLESS_ONCE = -3
ONCE_FLAT_BYTES_PER_PIXEL = 0.3
PALETTE = "PNG8"  # PNG of 256 colours (median cut, no dithering): UI and text keep their edges, at 2-3x less than PNG
# The median cut maps each pixel to its nearest palette colour through a cache of the colours it has met: a frame of
# millions of distinct colours (a gradient, which PNG stores in tens of KB) misses it on every pixel, at many times
# the CPU of the rest of the ladder and over 40 bytes a pixel (docs/performance.md). Past this many colours it is not
# tried (the RGBA one, an octree, has no such cost); a screenshot has a few thousand.
PALETTE_MAX_COLOURS = 65536
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

    def peek(self, key: bytes) -> Shrunk | None:
        """The entry for `key`, if any, without counting a lookup or refreshing it."""
        with self._lock:
            return self._entries.get(key)

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


def cache_key(
    payload: str, max_side: int | None, max_bytes: int | None, webp: bool = False, size: tuple[int, int] | None = None, once: bool = False
) -> bytes:
    digest = hashlib.blake2b(f"{max_side}:{max_bytes}:{webp}:{size}:{once}:".encode(), digest_size=32)
    digest.update(payload.encode("utf-8", "surrogatepass"))
    return digest.digest()


def shrink(
    payload: str,
    *,
    max_side: int | None,
    max_bytes: int | None,
    webp: bool = False,
    cache: ShrinkCache | None = None,
    size: tuple[int, int] | None = None,
    once: bool = False,
) -> Shrunk:
    """The image in base64 `payload` with its long side <= `max_side` and base64 length <= `max_bytes`.

    None means no limit. `webp`: the target decodes WebP (a WebP source stays WebP either way).
    `size`: the size the model sees the image at (its header's width and height scaled by the provider's rule): an
    image larger goes at that size, losslessly, unless it is smaller as it came (see the module docstring).
    `once`: the image goes up once and is referenced after (send_once): at that size, the encoding effort LOSSLESS_ONCE.
    Never raises: anything that goes wrong is a Shrunk with a reason.
    """
    cache = CACHE if cache is None else cache
    key = cache_key(payload, max_side, max_bytes, webp, size, once)
    hit = cache.get(key)
    if hit is not None:
        return hit
    try:
        opened = _open(payload, max_side, max_bytes, webp, size, once)
    except Exception as exc:  # noqa: BLE001 - a broken image is dropped, never a broken request
        opened = _could_not(exc)
    if isinstance(opened, Shrunk):
        result = opened
    else:
        cost = opened.cost
        if not BUDGET.reserve(cost):
            budget = format_size(BUDGET.limit)
            log.warning(
                "trimflow: an image of %dx%d was not re-encoded: the %s decoding budget had no room for the %s it may need",
                opened.width,
                opened.height,
                budget,
                format_size(cost),
            )
            # This moment's reason, not the image's: not cached, so the next request tries again.
            return Shrunk(reason=f"the {budget} decoding budget was in use by other images")
        try:
            # The same image in another request may have been shrunk while this one waited for room.
            result = cache.peek(key) or _shrink(opened)
        except Exception as exc:  # noqa: BLE001 - as above; caught here so its frames (and pixels) go before the room does
            result = _could_not(exc)
        finally:
            del opened  # the source bytes too, before the room they took is given back
            BUDGET.release(cost)
    cache.put(key, result)
    return result


def _could_not(exc: Exception) -> Shrunk:
    return Shrunk(reason=f"could not be re-encoded ({type(exc).__name__})")


@dataclass(slots=True)
class _Opened:
    """An image whose header Pillow has read (nothing decoded yet), and what shrinking it takes."""

    im: Image.Image | None  # taken by `_shrink`, so the source pixels can go once normalised
    raw: bytes
    payload_chars: int  # its base64 length as it came
    width: int  # as it comes, before a JPEG's reduced decode
    height: int
    long_side: int  # the long side the ladder starts at
    max_bytes: int | None
    webp: bool
    cost: int = 0  # the most memory decoding and re-encoding it can hold at once, in bytes
    native: tuple[int, int] | None = None  # the size the model sees it at, when it goes at that size
    original: int | None = None  # its base64 length and type name, when it may go as it came
    once: bool = False  # it goes up once (send_once): LOSSLESS_ONCE at the size the model sees


def open_image(payload: str) -> tuple[Image.Image, bytes] | str:
    """The image base64 `payload` holds, opened (its pixels not read yet) with the decoders allowed and within
    MAX_PIXELS, and its bytes; else why not."""
    raw = _b64decode(payload)
    if raw is None:
        return "not valid base64"
    head = sniff_bytes(raw)
    if head is not None and head.width and head.height and head.width * head.height > MAX_PIXELS:
        return _too_many_pixels(head.width, head.height)
    try:
        im = Image.open(io.BytesIO(raw), formats=_DECODERS)
    except Image.DecompressionBombError:
        return f"over the {MAX_PIXELS // 1_000_000}-megapixel decoding limit"
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        return "could not be decoded"
    # No `with`: closing would also free the pixels; the BytesIO holds no OS resource.
    width, height = im.size
    if width * height > MAX_PIXELS:
        return _too_many_pixels(width, height)
    return im, raw


def _open(
    payload: str, max_side: int | None, max_bytes: int | None, webp: bool, size: tuple[int, int] | None = None, once: bool = False
) -> Shrunk | _Opened:
    """The image opened and its cost worked out; or the outcome, when it needs no decoding (nothing to do, or refused)."""
    opened_image = open_image(payload)
    if isinstance(opened_image, str):
        return Shrunk(reason=opened_image)
    im, raw = opened_image
    width, height = im.size
    source = im.format or "PNG"
    fits_side = max_side is None or max(width, height) <= max_side
    fits_bytes = max_bytes is None or len(payload) <= max_bytes
    native = _native_target(size, width, height, max_side)
    as_it_came = fits_side and fits_bytes and source in _ACCEPTED
    if as_it_came and native is None:
        return Shrunk()
    long_side = max(width, height)
    if max_side is not None:
        long_side = min(long_side, max_side)
    if native is not None:
        long_side = max(native)
    if source == "JPEG" and long_side < max(width, height):
        # Decode at 1/2, 1/4 or 1/8 scale when that still covers the target: 4-60x less work.
        im.draft(None, _fit(width, height, long_side))
    original = len(payload) + len(_MIME.get(source, "")) if as_it_came else None
    opened = _Opened(im, raw, len(payload), width, height, long_side, max_bytes, webp, native=native, original=original, once=once)
    opened.cost = _peak_bytes(opened, im)
    if opened.cost > BUDGET.limit:
        need, budget = format_size(opened.cost), format_size(BUDGET.limit)
        log.warning("trimflow: an image of %dx%d was not re-encoded: it may need %s, over the %s decoding budget", width, height, need, budget)
        return Shrunk(reason=f"{width}x{height} may need {need} to re-encode, over the {budget} decoding budget")
    return opened


def _shrink(opened: _Opened) -> Shrunk:
    im, opened.im = opened.im, None
    assert im is not None
    width, height = opened.width, opened.height
    source = im.format or "PNG"
    try:
        im.load()
    except (OSError, ValueError, SyntaxError):
        return Shrunk(reason="could not be decoded")
    native = opened.native
    if im.getexif().get(_ORIENTATION, 1) in _QUARTER_TURNS:
        width, height = height, width  # the pixels are turned upright below
        native = None if native is None else (native[1], native[0])
    pixels = _normalize(im)
    del im  # the source's pixels, when normalising made new ones
    rescue = _rescue(opened, source, width, height, pixels.mode)
    if native is not None:
        seen = _at_native(pixels, native, _native_step(opened, native, rescue), opened.max_bytes, opened.original)
        if seen is not None:
            return seen
    return _ladder(pixels, width, height, opened.long_side, opened.max_bytes, rescue)


def _native_target(size: tuple[int, int] | None, width: int, height: int, max_side: int | None) -> tuple[int, int] | None:
    """`size` when the image goes at it: smaller than the image and within the side limit (a smaller limit wins)."""
    if size is None or size == (width, height) or size[0] > width or size[1] > height or min(size) < 1:
        return None
    return size if max_side is None or max(size) <= max_side else None


def _native_step(opened: _Opened, size: tuple[int, int], rescue: _Rescue) -> tuple[str, int]:
    """The lossless encoding at the size the model sees: WebP where the target takes it (and the frame is not too
    large for its encoder, which no provider's size is), else PNG."""
    if opened.webp and size[0] * size[1] <= MAX_HEAVY_PIXELS:
        return "WEBP", LOSSLESS_ONCE if opened.once else LOSSLESS_QUICK
    return "PNG", rescue.png_level


def _at_native(pixels: Image.Image, size: tuple[int, int], step: tuple[str, int], max_bytes: int | None, original: int | None) -> Shrunk | None:
    """The image at `size` in its lossless encoding `step`; Shrunk() when the original, within the limits, is no
    larger (`original`: its base64 length and type name, None when it is over a limit); None when that encoding is
    over `max_bytes` (the ladder goes on from this size)."""
    frame = pixels.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)
    frame.info = {}
    fmt, setting = step
    data = _encode(frame, fmt, setting)
    del frame
    length = 4 * -(-len(data) // 3)
    if original is not None and length + len(_MIME[fmt]) >= original:
        return Shrunk()  # as it came: never more bytes than that
    if max_bytes is not None and length > max_bytes:
        return None
    return Shrunk(base64.b64encode(data).decode("ascii"), _MIME[fmt], size[0], size[1])


def _rescue(opened: _Opened, source: str, width: int, height: int, mode: str | None) -> _Rescue:
    """What the ladder may try for this image; `mode` is the normalised pixels' (None: RGB or RGBA, the most it may try)."""
    raw_bytes, max_bytes = len(opened.raw), opened.max_bytes
    dense = source == "PNG" and raw_bytes > DENSE_BYTES_PER_PIXEL * width * height  # (BMP is never compressed)
    png_level = PNG_LEVEL_DENSE if dense else PNG_LEVEL
    screen_like = source == "PNG" and raw_bytes <= LOSSLESS_WEBP_BYTES_PER_PIXEL * width * height
    lossless_webp = opened.webp and screen_like and max_bytes is not None and opened.payload_chars <= LOSSLESS_WEBP_REACH * max_bytes
    recompress = source == "PNG" and not dense and max_bytes is not None and opened.payload_chars <= LOSSLESS_MARGIN * max_bytes
    # A JPEG stays JPEG (faster, and no second kind of artifact over its own); a WebP stays WebP.
    lossy = "WEBP" if source == "WEBP" or (opened.webp and source != "JPEG") else "JPEG"
    palette = screen_like and lossy == "JPEG" and (mode is None or mode in ("RGB", "RGBA"))
    return _Rescue(source, lossy, png_level, recompress, lossless_webp, palette)


def _too_many_pixels(width: int, height: int) -> str:
    return f"{width}x{height} is over the {MAX_PIXELS // 1_000_000}-megapixel decoding limit"


# Bytes an encoder takes per pixel of an RGB(A) frame it encodes, its output included: measured worst cases with a
# margin (noise; for the median cut, PALETTE_MAX_COLOURS of them); libwebp also takes a fixed amount at any size. PNG
# and JPEG take less for a grey frame (GREY_SHARE of it); WebP converts grey to colour first.
_ENCODER_BYTES_PER_PIXEL = {"PNG": 6, "JPEG": 4, "WEBP": 44, PALETTE: 12}
_WEBP_FIXED = 16 * 2**20
_MAX_OUTPUT_PER_PIXEL = 4.25  # the largest encoding of a frame: incompressible RGBA as PNG, with its row filters
_GREY_SHARE = 0.375
_DECODER_BYTES_PER_PIXEL = {"WEBP": 12}  # libwebp's canvases and the frame Pillow copies out of them
_JPEG_LIKE = ("JPEG", "MPO")
# What the largest moment holds is not all a shrink takes from the system: a freed copy leaves a hole in the heap
# that a larger one cannot use (measured: up to a fifth more), and the codecs and Python keep some state of their own.
_HOLES = 1.25
_MARGIN = 16 * 2**20


def _pixel_bytes(mode: str) -> int:
    """What one pixel takes in a Pillow image of `mode` (RGB is stored in 4 bytes, like RGBA)."""
    return 1 if mode in ("1", "L", "P") else 2 if mode.startswith("I;16") else 4


def _peak_bytes(opened: _Opened, im: Image.Image) -> int:
    """The most memory shrinking the opened image can hold at once, from its header alone: the largest of what is
    live while it decodes, while it is normalised, while the first size is made and while a size is encoded, with
    every copy the code makes at its mode's pixel size and every encoder the ladder may try at its worst."""
    source, mode = im.format or "PNG", im.mode
    decoded_w, decoded_h = im.size  # after a JPEG's reduced decode
    area = decoded_w * decoded_h
    source_bytes = area * _pixel_bytes(mode)
    transparent = "transparency" in im.info
    alpha = mode in ("RGBA", "LA", "PA") or transparent
    if source in _JPEG_LIKE:
        decoder = _jpeg_coefficients(im, opened.width, opened.height)
    else:
        decoder = _DECODER_BYTES_PER_PIXEL.get(source, 0) * area
    decoding = source_bytes + decoder
    # _normalize: an upright copy, a conversion, and alpha that hides nothing dropped (each beside the source).
    turned = source_bytes if _may_turn(im, source) else 0
    if alpha:
        converted, dropped = (0 if mode in ("RGBA", "LA") and not transparent else 4 * area), 4 * area
    else:
        converted, dropped = (0 if mode in ("L", "RGB") else area * (1 if mode == "1" else 4)), 0
    normalising = source_bytes + turned + converted + dropped
    depth = 1 if mode in ("L", "1") and not transparent else 4  # the normalised pixels' pixel size
    pixels = area * depth
    frame_w, frame_h = opened.native or _fit(opened.width, opened.height, opened.long_side)
    first = frame_w * frame_h
    resizing = frame = 0
    if first != area:
        frame = first * depth
        # Pillow resizes LA and RGBA through a premultiplied copy, may reduce by a whole factor first, and
        # resamples in two passes through an image as wide as the frame and as tall as the source (either way up:
        # the pixels may have been turned).
        between = max(frame_w * decoded_h, frame_h * decoded_w) * depth
        making = (pixels if alpha else 0) + pixels // 2 + between + frame
        resizing = pixels + max(making, 2 * frame)
    normalised = "L" if depth == 1 else "LA" if mode == "LA" and not transparent else None  # None: RGB or RGBA
    rescue = _rescue(opened, source, opened.width, opened.height, normalised)
    max_bytes, full_size = opened.max_bytes, first == opened.width * opened.height
    steps = rescue.steps(True, full_size, first)
    if opened.native is not None:  # the lossless encoding at the size the model sees comes first
        steps = [_native_step(opened, opened.native, rescue), *steps]
    encoding = pixels + frame + _encoding_peak(steps, first, depth, alpha, max_bytes)
    if max_bytes is not None:  # without a byte limit the first encoding is the one sent
        # The later sizes: each at most 0.75^2 of the first in area (one frame at a time); the heavy encoders come
        # back below MAX_HEAVY_PIXELS.
        for later in {int(first * SCALE_STEP**2), min(int(first * SCALE_STEP**2), MAX_HEAVY_PIXELS)}:
            steps = rescue.steps(False, False, later)
            encoding = max(encoding, pixels + later * depth + _encoding_peak(steps, later, depth, alpha, max_bytes))
    return int((len(opened.raw) + max(decoding, normalising, resizing, encoding)) * _HOLES) + _MARGIN


def _encoding_peak(steps: list[tuple[str, int | None]], area: int, depth: int, alpha: bool, max_bytes: int | None) -> int:
    """What encoding a frame of `area` pixels (`depth` bytes each) may hold beside it with these steps (see _ladder)."""
    if max_bytes is None:  # the first encoding is the one sent (256 colours may be passed over for its colours)
        steps = steps[: next((i for i, (fmt, _) in enumerate(steps) if fmt != PALETTE), len(steps)) + 1]
    formats = {fmt for fmt, _ in steps}
    share = 1.0 if depth == 4 else _GREY_SHARE
    flat = 4 * area if alpha and "JPEG" in formats else 0  # kept through the JPEG steps
    flattening = 5 * area if flat else 0  # an RGBA copy of LA, and the alpha band
    encoder = max(
        _ENCODER_BYTES_PER_PIXEL[fmt] * area + _WEBP_FIXED if fmt == "WEBP" else int(_ENCODER_BYTES_PER_PIXEL[fmt] * share * area) for fmt in formats
    )
    output = _MAX_OUTPUT_PER_PIXEL * share * area
    if max_bytes is not None:
        output = min(output, 0.75 * max_bytes)
    taking = int(output * 11 / 3)  # the bytes that fit, their base64, and its text
    return flat + max(flattening, encoder, taking)


def _jpeg_coefficients(im: Image.Image, width: int, height: int) -> int:
    """libjpeg's coefficient buffer: a progressive or multi-scan JPEG holds 2 bytes for each coefficient of every
    component at its full size, however reduced the decode. Counted for any JPEG: which it is shows only in the scans."""
    layers = getattr(im, "layer", None) or [("", 1, 1, 0)] * 4
    h_max, v_max = max(layer[1] for layer in layers), max(layer[2] for layer in layers)
    mcus_w, mcus_h = -(-width // (8 * h_max)), -(-height // (8 * v_max))
    return sum(mcus_w * layer[1] * mcus_h * layer[2] for layer in layers) * 64 * 2


def _may_turn(im: Image.Image, source: str) -> bool:
    """Whether normalising may make an upright copy. A JPEG's or WebP's EXIF is read with its header; a PNG's may
    follow its pixels (and reading it would decode them), and GIF and BMP are counted alike."""
    if source in _JPEG_LIKE or source == "WEBP":
        return im.getexif().get(_ORIENTATION, 1) != 1
    return True


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
        target = "LA" if im.mode in ("L", "LA") and not transparent else "RGBA"
        out = im if im.mode == target else im.convert(target)  # (a convert to its own mode only copies)
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


@dataclass(frozen=True, slots=True)
class _Rescue:
    """What the ladder may try for one image (see the module docstring)."""

    source: str  # the decoded format
    lossy: str  # WEBP or JPEG
    png_level: int  # zlib level for PNG output
    recompress: bool  # a PNG just over the limit: level 9 at its own size first
    lossless_webp: bool  # a screenshot-like PNG, for a target that takes WebP
    palette: bool  # a screenshot-like PNG, for a target that takes no WebP: 256 colours before JPEG

    def steps(self, first: bool, full_size: bool, area: int) -> list[tuple[str, int | None]]:
        """(format, setting) to try at one size of `area` pixels, least lossy first. `first`: the size the side limit
        asks for (or the image's own), where the lossless steps are tried; `full_size`: the image's own size."""
        steps: list[tuple[str, int | None]] = []
        heavy = area <= MAX_HEAVY_PIXELS
        if first and full_size and self.recompress:
            steps.append(("PNG", 9))
        if self.source in _PNG_LIKE and not (full_size and self.source == "PNG"):
            steps.append(("PNG", self.png_level))  # a smaller PNG, or GIF and BMP as PNG
        if first and self.lossless_webp and heavy:
            steps.append(("WEBP", LOSSLESS))
        if self.palette and heavy:
            steps.append((PALETTE, self.png_level))
        steps.extend((self.lossy if heavy else "JPEG", q) for q in QUALITIES)
        return steps


def _ladder(im: Image.Image, width: int, height: int, long_side: int, max_bytes: int | None, rescue: _Rescue) -> Shrunk:
    first = True
    while long_side >= MIN_SIDE:
        size = _fit(width, height, long_side)
        frame = im if im.size == size else im.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)
        frame.info = {}
        flat: Image.Image | None = None
        smallest: int | None = None
        for fmt, setting in rescue.steps(first, size == (width, height), size[0] * size[1]):
            if fmt == PALETTE and frame.mode != "RGBA" and frame.getcolors(PALETTE_MAX_COLOURS) is None:
                continue
            if fmt == "JPEG" and flat is None:
                flat = _flatten(frame)
            data = _encode(flat if fmt == "JPEG" and flat is not None else frame, fmt, setting)
            length = 4 * -(-len(data) // 3)
            if max_bytes is None or length <= max_bytes:
                return Shrunk(base64.b64encode(data).decode("ascii"), _MIME[fmt], size[0], size[1])
            del data  # gone before the next encoding (_peak_bytes counts one at a time)
            smallest = length if smallest is None else min(smallest, length)
            if fmt in ("JPEG", "WEBP") and setting != LOSSLESS and length > 2 * max_bytes:
                break  # the lower qualities can't halve it: go down in size instead
        del frame, flat  # gone before the next size is made
        first = False
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
    background.paste(im if im.mode == "RGBA" else im.convert("RGBA"), mask=im.getchannel("A"))
    return background


def _encode(im: Image.Image, fmt: str, setting: int | None) -> bytes:
    """Encode with fixed settings and no metadata; `setting` is the quality, or PNG's zlib level."""
    out = io.BytesIO()
    if fmt == PALETTE:
        method = Image.Quantize.FASTOCTREE if im.mode == "RGBA" else Image.Quantize.MEDIANCUT
        im.quantize(256, method=method, dither=Image.Dither.NONE).save(out, "PNG", compress_level=setting)
    elif fmt == "PNG":
        im.save(out, "PNG", compress_level=setting)
    elif fmt == "JPEG":
        im.save(out, "JPEG", quality=setting, subsampling="4:2:0", optimize=False, progressive=False)
    elif setting == LOSSLESS:
        im.save(out, "WEBP", lossless=True, quality=80, method=4)
    elif setting == LOSSLESS_QUICK:
        im.save(out, "WEBP", lossless=True, quality=50, method=1)
    elif setting == LOSSLESS_ONCE:
        im.save(out, "WEBP", lossless=True, quality=50, method=0)
        if out.tell() < ONCE_FLAT_BYTES_PER_PIXEL * im.width * im.height:
            quick = _encode(im, fmt, LOSSLESS_QUICK)
            if len(quick) < out.tell():
                return quick
    else:
        im.save(out, "WEBP", quality=setting, method=4)
    return out.getvalue()
