"""Bounded request-body decoding: every coding mitmproxy re-encodes round-trips, bombs stop at the limit,
anything else is a clear error that quotes nothing of the body.

The bombs come from tests/bombs.py, which tests/hostile/test_hostile.py and the end-to-end tests use too.
"""

from __future__ import annotations

import gzip
import os
import zlib

import brotli
import pytest
import zstandard
from mitmproxy.net import encoding as mitmproxy_encoding

from trimflow._decode import (
    _OUT_STEP,
    _ZSTD_MAX_RATIO,
    BROTLI_BOUNDED,
    DEFAULT_MAX_DECODED_BYTES,
    OPTION,
    BodyTooLarge,
    DecodeError,
    UnsupportedEncoding,
    decode_body,
    is_identity,
)

from .bombs import GiB, MiB, _Crc, deflate_bomb, gzip_bomb, zstd_bomb

# Planted in bodies: no error message may quote it.
MARKER = b"BODY-MARKER-7f3e"
# A JSON body of mixed content: incompressible bytes, text, the marker.
BODY = b'{"model":"m","messages":[{"role":"user","content":"' + MARKER + b" " + os.urandom(3000).hex().encode() + b" " + b"repeat " * 5000 + b'"}]}'

# Each step may overshoot the limit by at most this much before the decoder stops (zstd is fed at least
# 16 input bytes at a time, brotli's output buffer grows in blocks up to twice the step).
OVERSHOOT = max(2 * _OUT_STEP, 16 * _ZSTD_MAX_RATIO)


# --- the bomb builders -----------------------------------------------------------------------------------


def test_the_bomb_builders_make_real_bombs() -> None:
    small = gzip_bomb(48 * MiB)
    assert gzip.decompress(small) == bytes(48 * MiB)  # header, blocks, CRC and size all valid
    assert len(small) < 48 * MiB // 900
    assert zlib.decompress(deflate_bomb(32 * MiB), -zlib.MAX_WBITS) == bytes(32 * MiB)
    assert zstandard.ZstdDecompressor().decompressobj().decompress(zstd_bomb(32 * MiB)) == bytes(32 * MiB)
    assert _Crc.zeros(5 * MiB + 3)(0) == zlib.crc32(bytes(5 * MiB + 3))


# --- round trips ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("coding", ["gzip", "deflate", "zstd", "br"])
def test_what_mitmproxy_encodes_decodes_to_the_same_bytes(coding: str) -> None:
    """The addon assigns request.content, and mitmproxy re-encodes it: the two must agree."""
    wire = mitmproxy_encoding.encode(BODY, coding)
    if coding == "br" and not BROTLI_BOUNDED:
        with pytest.raises(UnsupportedEncoding, match=r"brotli 1\.2"):
            decode_body(wire, coding, 10 * MiB)
        return
    assert decode_body(wire, coding, 10 * MiB) == BODY
    assert decode_body(wire, coding.upper(), 10 * MiB) == BODY  # codings are case-insensitive
    assert decode_body(wire, f" {coding} ", 10 * MiB) == BODY


@pytest.mark.parametrize(
    ("name", "wire", "coding"),
    [
        ("python-gzip", gzip.compress(BODY), "gzip"),
        ("zlib-labelled-gzip", zlib.compress(BODY), "gzip"),  # mitmproxy accepts either header under "gzip"
        ("two-gzip-members", gzip.compress(BODY[:1000]) + gzip.compress(BODY[1000:]), "gzip"),
        ("gzip-zero-padding", gzip.compress(BODY) + bytes(16), "gzip"),
        ("zlib-deflate", zlib.compress(BODY), "deflate"),
        ("raw-deflate", zlib.compress(BODY)[2:-4], "deflate"),
        ("zstd-two-frames", zstandard.ZstdCompressor().compress(BODY[:999]) + zstandard.ZstdCompressor().compress(BODY[999:]), "zstd"),
        ("zstd-unsized-stream", zstandard.ZstdCompressor(write_content_size=False).compress(BODY), "zstd"),
        ("identity", BODY, "identity"),
        ("no-header", BODY, None),
        ("empty-header", BODY, ""),
        ("identity-in-a-list", gzip.compress(BODY), "identity, gzip"),
    ],
)
def test_other_valid_encodings_decode(name: str, wire: bytes, coding: str | None) -> None:
    assert decode_body(wire, coding, 10 * MiB) == BODY


def test_an_empty_body_is_empty_in_any_coding() -> None:
    for coding in ("gzip", "deflate", "zstd", "br", None):
        assert decode_body(b"", coding, 10) == b""


def test_identity_bodies_are_not_limited_they_are_in_memory_already() -> None:
    assert decode_body(BODY, None, 10) is BODY


@pytest.mark.parametrize("coding", ["gzip", "deflate", "zstd", "br"])
def test_a_body_of_exactly_the_limit_decodes_and_one_byte_more_does_not(coding: str) -> None:
    if coding == "br" and not BROTLI_BOUNDED:
        with pytest.raises(UnsupportedEncoding):
            decode_body(brotli.compress(BODY), coding, len(BODY))
        return
    wire = mitmproxy_encoding.encode(BODY, coding)
    assert decode_body(wire, coding, len(BODY)) == BODY
    with pytest.raises(BodyTooLarge) as caught:
        decode_body(wire, coding, len(BODY) - 1)
    assert caught.value.limit == len(BODY) - 1


# --- bombs ------------------------------------------------------------------------------------------------


def test_a_gzip_bomb_of_8_gib_stops_at_the_default_limit() -> None:
    bomb = gzip_bomb(8 * GiB)
    assert len(bomb) < 9 * MiB  # 8 GiB from under 9 MB: a thousandfold
    with pytest.raises(BodyTooLarge) as caught:
        decode_body(bomb, "gzip")
    error = caught.value
    assert DEFAULT_MAX_DECODED_BYTES < error.produced <= DEFAULT_MAX_DECODED_BYTES + OVERSHOOT
    assert str(error) == f"the gzip body of {len(bomb) / MiB:.1f}MB decodes to more than 256MB ({OPTION}); not decoded further"


@pytest.mark.parametrize(
    ("coding", "build"),
    [("gzip", gzip_bomb), ("deflate", deflate_bomb), ("zstd", zstd_bomb), ("br", lambda n: brotli.compress(bytes(n), quality=1))],
)
def test_every_coding_stops_a_bomb_within_one_step_of_the_limit(coding: str, build) -> None:
    bomb = build(256 * MiB)
    assert len(bomb) < 512 * 1024
    for limit in (1, 100_000, 3 * MiB + 7):
        if coding == "br" and not BROTLI_BOUNDED:
            with pytest.raises(UnsupportedEncoding):
                decode_body(bomb, coding, limit)
            continue
        with pytest.raises(BodyTooLarge) as caught:
            decode_body(bomb, coding, limit)
        assert limit < caught.value.produced <= limit + OVERSHOOT
        assert "decodes to more than" in str(caught.value)


def test_a_zstd_frame_that_declares_a_huge_size_is_still_bounded() -> None:
    # A frame header may claim any content size; only what really comes out counts.
    bomb = zstandard.ZstdCompressor(level=3).compress(bytes(64 * MiB))
    with pytest.raises(BodyTooLarge):
        decode_body(bomb, "zstd", MiB)


# --- clear errors -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "wire", "coding", "error", "says"),
    [
        ("plain-json-labelled-gzip", BODY, "gzip", DecodeError, "is not valid gzip"),
        ("plain-json-labelled-deflate", BODY, "deflate", DecodeError, "is not valid deflate"),
        ("plain-json-labelled-zstd", BODY, "zstd", DecodeError, "is not valid zstd"),
        ("truncated-gzip", gzip.compress(BODY)[:-9], "gzip", DecodeError, "truncated"),
        ("gzip-without-trailer", gzip.compress(BODY)[:-8], "gzip", DecodeError, "truncated"),
        ("truncated-deflate", zlib.compress(BODY)[: len(zlib.compress(BODY)) // 2], "deflate", DecodeError, "truncated"),
        ("truncated-zstd", zstandard.ZstdCompressor().compress(BODY)[:-5], "zstd", DecodeError, "truncated"),
        ("gzip-then-garbage", gzip.compress(BODY) + b"garbage" + MARKER, "gzip", DecodeError, "bytes after its end"),
        ("deflate-then-garbage", zlib.compress(BODY) + MARKER, "deflate", DecodeError, "bytes after its end"),
        ("zstd-then-garbage", zstandard.ZstdCompressor().compress(BODY) + MARKER, "zstd", DecodeError, "not valid zstd"),
        ("gzip-bad-crc", gzip.compress(BODY)[:-8] + b"\0\0\0\0" + gzip.compress(BODY)[-4:], "gzip", DecodeError, "not valid gzip"),
        ("x-gzip", gzip.compress(BODY), "x-gzip", UnsupportedEncoding, "unsupported content-encoding 'x-gzip'"),
        ("compress", BODY, "compress", UnsupportedEncoding, "unsupported content-encoding 'compress'"),
        # Python codec names that mitmproxy's decoder would apply: bz2 is a bomb of its own.
        ("bz2", BODY, "bz2", UnsupportedEncoding, "unsupported content-encoding 'bz2'"),
        ("base64", BODY, "base64", UnsupportedEncoding, "unsupported"),
        ("utf-8", BODY, "utf-8", UnsupportedEncoding, "unsupported"),
        ("stacked", gzip.compress(gzip.compress(BODY)), "gzip, gzip", UnsupportedEncoding, "stacked content-encodings"),
        ("overlong-header", BODY, "x" * 5000, UnsupportedEncoding, "unsupported"),
    ],
)
def test_bad_bodies_and_codings_are_clear_errors_quoting_nothing(name: str, wire: bytes, coding: str, error: type, says: str) -> None:
    with pytest.raises(error) as caught:
        decode_body(wire, coding, 10 * MiB)
    message = str(caught.value)
    assert says in message
    assert isinstance(caught.value, ValueError)
    assert MARKER.decode() not in message and "repeat" not in message
    assert len(message) < 200


def test_brotli_without_a_bounded_decoder_is_refused_never_inflated() -> None:
    wire = brotli.compress(BODY)
    if BROTLI_BOUNDED:
        assert decode_body(wire, "br", len(BODY)) == BODY
        with pytest.raises(DecodeError, match="truncated"):
            decode_body(wire[:-4], "br", 10 * MiB)
    else:  # brotli 1.1 (mitmproxy 11) inflates a whole call at once: a bomb would inflate in full
        with pytest.raises(UnsupportedEncoding, match=r"needs brotli 1\.2"):
            decode_body(wire, "br", 10 * MiB)


@pytest.mark.parametrize("header", [None, "", "identity", " Identity ", "none", "identity, none"])
def test_identity_names_no_coding(header) -> None:
    assert is_identity(header)


@pytest.mark.parametrize("header", ["gzip", "identity, gzip", "x-custom"])
def test_any_other_coding_is_not_identity(header) -> None:
    assert not is_identity(header)
