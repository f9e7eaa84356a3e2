"""Image type and size from header bytes: checked against Pillow on real encoded images."""

from __future__ import annotations

import base64
import io
import os
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, features

from trimflow._imageinfo import SNIFF_FIRST, ImageInfo, sniff_base64, sniff_bytes, sniff_media
from trimflow.formats import FORMATS

SIZES = [(1, 1), (3000, 17), (9000, 40), (17, 3000), (641, 479)]


def encode(img: Image.Image, fmt: str, **opts) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **opts)
    return buf.getvalue()


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def pillow_size(raw: bytes) -> tuple[int, int]:
    with Image.open(io.BytesIO(raw)) as im:
        return im.size


def check(raw: bytes, mime: str) -> None:
    """sniff_base64 and sniff_bytes both give Pillow's size and the right type."""
    want = ImageInfo(mime, *pillow_size(raw))
    assert sniff_base64(b64(raw)) == want
    assert sniff_bytes(raw) == want


def jpeg_sof(raw: bytes) -> tuple[int, int]:
    """Byte offset and marker of the first SOFn, found by walking segments independently."""
    pos = 2
    while True:
        assert raw[pos] == 0xFF
        marker, length = raw[pos + 1], struct.unpack(">H", raw[pos + 2 : pos + 4])[0]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return pos, marker
        pos += 2 + length


# --- the formats --------------------------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("mode", ["RGB", "RGBA", "P", "L", "1"])
def test_png(size, mode):
    check(encode(Image.new(mode, size), "PNG"), "image/png")


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("progressive", [False, True])
def test_jpeg(size, progressive):
    raw = encode(Image.new("RGB", size, (200, 30, 10)), "JPEG", progressive=progressive)
    assert jpeg_sof(raw)[1] == (0xC2 if progressive else 0xC0)
    check(raw, "image/jpeg")


def test_jpeg_grayscale_and_cmyk():
    check(encode(Image.new("L", (33, 7)), "JPEG"), "image/jpeg")
    check(encode(Image.new("CMYK", (7, 33)), "JPEG"), "image/jpeg")


def big_exif_jpeg(size=(1234, 567)) -> bytes:
    exif = Image.Exif()
    exif[0x010E] = "x" * 60_000  # ImageDescription: a ~60 KB APP1 segment before SOF
    raw = encode(Image.new("RGB", size, (1, 2, 3)), "JPEG", exif=exif.tobytes())
    assert jpeg_sof(raw)[0] > 60_000
    return raw


def test_jpeg_sof_after_large_exif():
    check(big_exif_jpeg(), "image/jpeg")


def test_jpeg_sof_after_several_large_segments():
    raw = encode(Image.new("RGB", (321, 123)), "JPEG")
    app13 = b"\xff\xed" + struct.pack(">H", 65_002) + os.urandom(65_000)
    raw = raw[:2] + app13 * 4 + raw[2:]  # SOF ~260 KB in
    assert jpeg_sof(raw)[0] > 260_000
    check(raw, "image/jpeg")


def test_jpeg_skipped_segments_are_never_decoded():
    # Replace the inside of the 60 KB EXIF block with invalid base64: the walker hops over it by
    # its length field, so it must never notice.
    raw = big_exif_jpeg()
    text = b64(raw)
    sof = jpeg_sof(raw)[0]
    lo, hi = 1000, (sof // 3) * 4 - 1000
    garbled = text[:lo] + "!" * (hi - lo) + text[hi:]
    assert sniff_base64(garbled) == ImageInfo("image/jpeg", 1234, 567)


def test_jpeg_data_after_sof_is_never_read():
    raw = encode(Image.new("RGB", (999, 77)), "JPEG")
    sof, _ = jpeg_sof(raw)
    end = sof + 2 + struct.unpack(">H", raw[sof + 2 : sof + 4])[0]  # first byte after SOF
    text = b64(raw)
    keep = -(-end // 3) * 4
    assert sniff_base64(text[:keep] + "!!!!" * ((len(text) - keep) // 4)) == ImageInfo("image/jpeg", 999, 77)


def test_jpeg_fill_bytes_and_standalone_markers():
    raw = encode(Image.new("RGB", (50, 60)), "JPEG")
    # Extra 0xFF fill before a marker, then TEM and RST0 (no length fields) before the next one.
    raw = raw[:2] + b"\xff\xff\xff\xff\x01\xff\xd0" + raw[2:]
    assert sniff_bytes(raw) == ImageInfo("image/jpeg", 50, 60)
    assert sniff_base64(b64(raw)) == ImageInfo("image/jpeg", 50, 60)


@pytest.mark.parametrize("marker", [0xC4, 0xC8, 0xCC])
def test_jpeg_dht_jpg_dac_are_not_sof(marker):
    # A segment that would read as 16x16 if C4/C8/CC were taken for SOF.
    raw = encode(Image.new("RGB", (50, 60)), "JPEG")
    fake = bytes([0xFF, marker]) + b"\x00\x07\x08\x00\x10\x00\x10"
    assert sniff_bytes(raw[:2] + fake + raw[2:]) == ImageInfo("image/jpeg", 50, 60)


@pytest.mark.parametrize("marker", [0xC1, 0xC3, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF])
def test_jpeg_other_sof_markers(marker):
    raw = bytearray(encode(Image.new("RGB", (50, 60)), "JPEG"))
    raw[jpeg_sof(bytes(raw))[0] + 1] = marker  # same layout, other coding process
    assert sniff_bytes(bytes(raw)) == ImageInfo("image/jpeg", 50, 60)


def test_jpeg_without_reachable_sof_is_still_a_jpeg():
    raw = big_exif_jpeg()
    assert sniff_base64(b64(raw)[:100]) == ImageInfo("image/jpeg", None, None)
    assert sniff_bytes(raw[:1000]) == ImageInfo("image/jpeg", None, None)
    # Height 0 means "defined later by a DNL marker": unknown, not zero.
    sof = jpeg_sof(raw)[0]
    raw0 = raw[: sof + 5] + b"\x00\x00" + raw[sof + 7 :]
    assert sniff_bytes(raw0) == ImageInfo("image/jpeg", 1234, None)


@pytest.mark.parametrize("size", SIZES)
def test_gif(size):
    check(encode(Image.new("P", size), "GIF"), "image/gif")


def test_gif_animated():
    frames = [Image.new("P", (70, 20), i) for i in range(3)]
    check(encode(frames[0], "GIF", save_all=True, append_images=frames[1:]), "image/gif")


WEBP_SIZES = [(1, 1), (3000, 17), (9000, 40), (3, 5), (16383, 2)]


def webp_chunk(raw: bytes) -> bytes:
    return raw[12:16]


@pytest.mark.parametrize("size", WEBP_SIZES)
def test_webp_lossy_vp8(size):
    raw = encode(Image.new("RGB", size, (9, 99, 199)), "WEBP", quality=80)
    assert webp_chunk(raw) == b"VP8 "
    check(raw, "image/webp")


@pytest.mark.parametrize("size", WEBP_SIZES)
def test_webp_lossless_vp8l(size):
    raw = encode(Image.new("RGB", size, (9, 99, 199)), "WEBP", lossless=True)
    assert webp_chunk(raw) == b"VP8L"
    check(raw, "image/webp")


@pytest.mark.parametrize("size", WEBP_SIZES)
def test_webp_alpha_vp8x(size):
    raw = encode(Image.new("RGBA", size, (9, 99, 199, 128)), "WEBP", quality=80)
    assert webp_chunk(raw) == b"VP8X"
    check(raw, "image/webp")


def test_webp_animated_vp8x():
    frames = [Image.new("RGB", (301, 7), (i * 80, 0, 0)) for i in range(3)]
    raw = encode(frames[0], "WEBP", save_all=True, append_images=frames[1:], duration=100)
    assert webp_chunk(raw) == b"VP8X"
    check(raw, "image/webp")


@pytest.mark.parametrize("size", [(1, 1), (3000, 17), (641, 479)])
@pytest.mark.parametrize("mode", ["RGB", "P", "1"])
def test_bmp(size, mode):
    check(encode(Image.new(mode, size), "BMP"), "image/bmp")


def test_bmp_top_down():
    raw = bytearray(encode(Image.new("RGB", (40, 30)), "BMP"))
    raw[22:26] = struct.pack("<i", -30)
    assert sniff_bytes(bytes(raw)) == ImageInfo("image/bmp", 40, 30)


def box(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", 8 + len(payload)) + kind + payload


def ispe(w: int, h: int) -> bytes:
    return box(b"ispe", b"\0\0\0\0" + struct.pack(">II", w, h))


def heif(major: bytes, compatible: list[bytes], sizes: list[tuple[int, int]]) -> bytes:
    ftyp = box(b"ftyp", major + b"\0\0\0\0" + b"".join(compatible))
    ipco = box(b"ipco", b"".join(ispe(w, h) for w, h in sizes))
    meta = box(b"meta", b"\0\0\0\0" + box(b"hdlr", b"\0" * 24) + box(b"iprp", ipco))
    return ftyp + meta + box(b"mdat", os.urandom(500))


def test_heic_and_avif_from_boxes():
    # A grid HEIC: 512x512 tiles, a 320x240 thumbnail, and the 4032x3024 output item.
    raw = heif(b"heic", [b"mif1", b"heic"], [(512, 512), (320, 240), (4032, 3024)])
    assert sniff_bytes(raw) == ImageInfo("image/heic", 4032, 3024)
    assert sniff_base64(b64(raw)) == ImageInfo("image/heic", 4032, 3024)
    raw = heif(b"mif1", [b"avif", b"miaf"], [(1920, 1080)])
    assert sniff_base64(b64(raw)) == ImageInfo("image/avif", 1920, 1080)
    assert sniff_bytes(heif(b"avif", [], [])) == ImageInfo("image/avif", None, None)


def test_mp4_is_not_an_image():
    assert sniff_bytes(heif(b"isom", [b"isom", b"mp42"], [(640, 480)])) is None


@pytest.mark.skipif(not features.check("avif"), reason="Pillow built without AVIF")
def test_avif_from_pillow():
    check(encode(Image.new("RGB", (123, 45)), "AVIF"), "image/avif")


# --- base64 forms -------------------------------------------------------------------------------


def sample_images() -> list[tuple[bytes, str]]:
    return [
        (encode(Image.new("RGBA", (3000, 17)), "PNG"), "image/png"),
        (big_exif_jpeg(), "image/jpeg"),
        (encode(Image.new("RGB", (77, 5)), "JPEG", progressive=True), "image/jpeg"),
        (encode(Image.new("P", (9000, 40)), "GIF"), "image/gif"),
        (encode(Image.new("RGB", (640, 3)), "WEBP"), "image/webp"),
        (encode(Image.new("RGB", (640, 3)), "WEBP", lossless=True), "image/webp"),
        (encode(Image.new("RGBA", (640, 3)), "WEBP"), "image/webp"),
    ]


def test_urlsafe_alphabet():
    for raw, mime in sample_images():
        assert sniff_base64(base64.urlsafe_b64encode(raw).decode()) == ImageInfo(mime, *pillow_size(raw))


def test_urlsafe_chars_in_the_header_itself():
    # Width/height bytes chosen so the header's base64 needs '+' / '/' (urlsafe '-' / '_').
    raw = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR" + struct.pack(">II", 0xFBFF, 0xFFBF) + b"\x08\x02\0\0\0"
    text = base64.urlsafe_b64encode(raw).decode()
    assert "-" in text[:32] or "_" in text[:32]
    assert sniff_base64(text) == ImageInfo("image/png", 0xFBFF, 0xFFBF)


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_line_wrapped_base64(newline):
    for raw, mime in sample_images():
        text = base64.encodebytes(raw).decode().replace("\n", newline)  # 76-char lines
        assert sniff_base64(text) == ImageInfo(mime, *pillow_size(raw))


def test_leading_and_trailing_whitespace():
    raw = encode(Image.new("RGB", (12, 34)), "PNG")
    assert sniff_base64("  \n" + b64(raw) + "\n") == ImageInfo("image/png", 12, 34)


def test_missing_padding():
    for raw, mime in sample_images():
        text = b64(raw).rstrip("=")
        assert sniff_base64(text) == ImageInfo(mime, *pillow_size(raw))
    tiny = b"GIF89a" + struct.pack("<HH", 5, 6)  # 10 bytes: base64 ends in "=="
    assert b64(tiny).endswith("==")
    assert sniff_base64(b64(tiny).rstrip("=")) == ImageInfo("image/gif", 5, 6)


def test_truncated_to_100_chars():
    for raw, mime in sample_images():
        info = sniff_base64(b64(raw)[:100])
        if mime == "image/jpeg":
            assert info is not None and info.mime == mime  # SOF may lie beyond the cut
        else:
            assert info == ImageInfo(mime, *pillow_size(raw))


@pytest.mark.parametrize(
    "text",
    [
        "",
        "=",
        "====",
        "A",
        "!!!!!!!!",
        "not base64 at all, just words",
        b64(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj"),
        b64(b"<svg xmlns='http://www.w3.org/2000/svg'/>"),
        b64(b"RIFF\0\0\0\0WAVEfmt "),
        b64(b"BM" + b"\0" * 40),  # "BM" without a valid DIB header
        b64(os.urandom(1)),
        "\n\n\n   \t",
        "é" * 200,
    ],
)
def test_not_an_image(text):
    assert sniff_base64(text) is None


def test_not_an_image_bytes():
    assert sniff_bytes(b"") is None
    assert sniff_bytes(b"%PDF-1.7") is None


@pytest.mark.parametrize("cut", [1, 5, 8, 12, 20, 26, 30])
def test_truncated_headers_never_raise(cut):
    for raw, _ in sample_images():
        info = sniff_bytes(raw[:cut])
        assert info is None or isinstance(info, ImageInfo)
        info = sniff_base64(b64(raw[:cut]))
        assert info is None or isinstance(info, ImageInfo)


# --- only the prefix is read --------------------------------------------------------------------


@pytest.fixture(scope="module")
def big_png_b64() -> tuple[str, tuple[int, int]]:
    size = (2000, 1700)  # random RGB, stored: ~10 MB of PNG, ~13.6 MB of base64
    raw = encode(Image.frombytes("RGB", size, os.urandom(size[0] * size[1] * 3)), "PNG", compress_level=0)
    assert len(raw) > 10_000_000
    return b64(raw), size


def test_big_png_only_prefix_is_read(big_png_b64):
    text, size = big_png_b64
    garbled = text[:200] + "!!!!" * ((len(text) - 200) // 4)
    assert sniff_base64(garbled) == ImageInfo("image/png", *size)


def test_line_wrapped_big_png_only_prefix_is_read(big_png_b64):
    # How long the sniff takes is the bench's (scripts/bench: sniff_big_png_us, sniff_wrapped_png_ms).
    text, size = big_png_b64
    wrapped = "\n".join(text[i : i + 76] for i in range(0, 760_000, 76))
    assert sniff_base64(wrapped + "!!!!" * ((len(text) - 760_000) // 4)) == ImageInfo("image/png", *size)


# --- never raises -------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_arbitrary_text_never_raises(text):
    info = sniff_base64(text)
    assert info is None or isinstance(info, ImageInfo)


MAGICS = [b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF89a", b"RIFF\0\0\0\0WEBPVP8X", b"BM", b"\0\0\0\x18ftypheic"]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(MAGICS), st.binary(max_size=300), st.booleans())
def test_arbitrary_bytes_after_a_magic_never_raise(magic, tail, urlsafe):
    raw = magic + tail
    info = sniff_bytes(raw)
    assert info is None or isinstance(info, ImageInfo)
    text = (base64.urlsafe_b64encode if urlsafe else base64.b64encode)(raw).decode()
    assert sniff_base64(text) == info


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_raise(raw):
    info = sniff_bytes(raw)
    assert sniff_base64(b64(raw)) == info


# --- a request's media ---------------------------------------------------------------------------


def test_sniff_media_reads_the_declared_type_from_the_bytes_not_the_data_url() -> None:
    raw = encode(Image.new("RGB", (31, 41)), "WEBP")
    (media,) = FORMATS["openai-chat"].find_media(
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64(raw)}}]}]}
    )
    assert media.declared_mime == "image/png"
    assert sniff_media(media) == ImageInfo("image/webp", 31, 41)


def test_sniff_media_reads_past_a_large_exif_block_and_skips_remote_media() -> None:
    raw = bytearray(encode(Image.new("RGB", (50, 60)), "JPEG"))
    exif = b"\xff\xe1" + (40_000).to_bytes(2, "big") + bytes(39_998)  # an APP1 segment ~40 KB long
    raw[2:2] = exif
    body = {
        "messages": [
            {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": b64(bytes(raw))}}]}
        ]
    }
    (media,) = FORMATS["anthropic"].find_media(body)
    assert len(b64(bytes(raw))) > SNIFF_FIRST
    assert sniff_media(media) == ImageInfo("image/jpeg", 50, 60)
    (remote,) = FORMATS["openai-chat"].find_media(
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]}
    )
    assert sniff_media(remote) is None
