"""Bounded decoding of a request body's Content-Encoding (gzip, deflate, br, zstd).

A compressed body can inflate a thousandfold (gzip) or more (zstd, brotli): a 4 MB "gzip bomb"
becomes 4 GB. mitmproxy's own decoder inflates the whole body into memory; this one decodes in
steps and stops with `BodyTooLarge` as soon as the output passes `limit`, so a bomb costs at most
`limit` bytes (plus one step). Pure Python, no mitmproxy import: the codecs are the ones mitmproxy
brings (stdlib zlib, brotli, zstandard).

The encodings accepted are exactly those mitmproxy re-encodes when the addon assigns
`request.content`, so a pruned body goes upstream in the encoding it came in. Anything else
(`compress`, `x-gzip`, stacked codings such as "gzip, br", Python codec names such as `bz2` that
mitmproxy would happily apply) is `UnsupportedEncoding`: the proxy forwards such a body untouched.
Error messages name the encoding and sizes only, never body content.
"""

from __future__ import annotations

import zlib

import brotli
import zstandard

from ._human import format_size
from .errors import DecodeError

# 256 MiB: 8x Anthropic's 32 MB edge limit, 16x the default body budget (max_body_bytes 16MiB),
# 2.5x Gemini's 100 MB inline cap; only OpenAI documents more (512 MB). A compressed body that
# inflates further is forwarded untouched (a provider refuses it or takes it as it is), so the limit
# loses nothing an agent sends while one request can never make trimflow allocate more than this.
DEFAULT_MAX_DECODED_BYTES = 256 * 1024 * 1024
OPTION = "trimflow_max_decoded_bytes"  # the mitmproxy option that sets the limit

SUPPORTED = ("gzip", "deflate", "br", "zstd")
_IDENTITY = ("", "identity", "none")  # "none": mitmproxy treats it as identity too

_OUT_STEP = 1024 * 1024  # output produced per step, at most (zlib, brotli)
_IN_STEP = 64 * 1024  # input fed per step (zlib)
# zstd's decompressor has no output cap, so it is fed input in slices small enough that even the
# densest frame cannot pass the remaining budget: an RLE block turns 4 bytes into 128 KiB (32768:1);
# 65536 leaves a margin.
_ZSTD_MAX_RATIO = 65536
_ZSTD_MIN_IN = 16
_GZIP_MAGIC = b"\x1f\x8b"
# brotli 1.2 (mitmproxy 12) caps output per call; brotli 1.1 (mitmproxy 11) inflates a whole call at once.
BROTLI_BOUNDED = hasattr(brotli.Decompressor, "can_accept_more_data")


class UnsupportedEncoding(DecodeError):
    """A Content-Encoding this module does not decode (the body is forwarded as it came)."""


class BodyTooLarge(DecodeError):
    """The decoded body would pass the limit. `produced` is how far decoding got before it stopped."""

    def __init__(self, encoding: str, wire_bytes: int, limit: int, produced: int) -> None:
        self.encoding, self.wire_bytes, self.limit, self.produced = encoding, wire_bytes, limit, produced
        super().__init__(
            f"the {encoding} body of {format_size(wire_bytes)} decodes to more than {format_size(limit)} ({OPTION}); not decoded further"
        )


def decode_body(raw: bytes, content_encoding: str | None, limit: int = DEFAULT_MAX_DECODED_BYTES) -> bytes:
    """The body with its Content-Encoding undone, at most `limit` bytes of it.

    Raises BodyTooLarge past the limit, UnsupportedEncoding for codings other than gzip, deflate,
    br, zstd (and identity), DecodeError for a body that is not valid in its coding (corrupt,
    truncated, trailing data). An identity body is returned as it is, whatever its size: it is
    already in memory, so there is nothing to bound.
    """
    if not raw:
        return raw  # nothing to decode, whatever the header says (mitmproxy reads it the same way)
    encoding = _single_coding(content_encoding)
    if encoding in _IDENTITY:
        return raw
    sink = _Sink(encoding, len(raw), limit)
    try:
        if encoding == "gzip":
            _inflate(raw, zlib.MAX_WBITS | 32, sink, members=True)  # 32: gzip or zlib header, as mitmproxy
        elif encoding == "deflate":
            try:
                _inflate(raw, zlib.MAX_WBITS, sink, members=False)
            except zlib.error:
                if sink.produced:
                    raise
                _inflate(raw, -zlib.MAX_WBITS, sink, members=False)  # raw deflate without the zlib header
        elif encoding == "br":
            _unbrotli(raw, sink)
        else:
            _unzstd(raw, sink)
    except (zlib.error, brotli.error, zstandard.ZstdError) as exc:
        raise DecodeError(f"the {encoding} body of {format_size(len(raw))} is not valid {encoding} ({_codec_reason(exc)})") from None
    return sink.result()


def is_identity(content_encoding: str | None) -> bool:
    """Whether a Content-Encoding header names no coding at all (absent, identity, none)."""
    return all(c.strip().lower() in _IDENTITY for c in (content_encoding or "").split(","))


def _single_coding(content_encoding: str | None) -> str:
    codings = [c.strip().lower() for c in (content_encoding or "").split(",")]
    codings = [c for c in codings if c not in _IDENTITY]
    if not codings:
        return ""
    shown = (content_encoding or "").strip()[:40]
    if len(codings) > 1:
        raise UnsupportedEncoding(f"stacked content-encodings are not supported: {shown!r}")
    if codings[0] not in SUPPORTED:
        raise UnsupportedEncoding(f"unsupported content-encoding {shown!r} (decoded: {', '.join(SUPPORTED)})")
    if codings[0] == "br" and not BROTLI_BOUNDED:
        raise UnsupportedEncoding("content-encoding 'br' needs brotli 1.2 or newer to decode within a size limit")
    return codings[0]


class _Sink:
    """Collects output and raises BodyTooLarge the moment it passes the limit."""

    def __init__(self, encoding: str, wire_bytes: int, limit: int) -> None:
        self.encoding, self.wire_bytes, self.limit = encoding, wire_bytes, limit
        self.chunks: list[bytes] = []
        self.produced = 0

    @property
    def room(self) -> int:
        """Output still allowed, plus the one byte that proves the limit was passed."""
        return self.limit - self.produced + 1

    def add(self, chunk: bytes) -> None:
        if not chunk:
            return
        self.produced += len(chunk)
        if self.produced > self.limit:
            self.chunks.clear()
            raise BodyTooLarge(self.encoding, self.wire_bytes, self.limit, self.produced)
        self.chunks.append(chunk)

    def result(self) -> bytes:
        return b"".join(self.chunks)


def _inflate(raw: bytes, wbits: int, sink: _Sink, *, members: bool) -> None:
    """zlib/gzip/raw deflate; with `members`, one gzip member after another (RFC 1952 allows a series)."""
    view = memoryview(raw)
    pos = 0  # where the input not yet fed starts
    while True:
        d = zlib.decompressobj(wbits)
        pending: bytes | memoryview = b""
        while not d.eof:
            if not pending and pos < len(raw):
                pending = view[pos : pos + _IN_STEP]
                pos += len(pending)
            out = d.decompress(pending, min(_OUT_STEP, sink.room))
            pending = d.unconsumed_tail
            if not out and not pending and pos >= len(raw) and not d.eof:
                # All input fed and nothing more comes out (a capped call may leave output inside
                # zlib, which the empty call above drains first).
                raise DecodeError(f"the {sink.encoding} body of {format_size(len(raw))} is truncated")
            sink.add(out)
        pos -= len(d.unused_data)  # the member ended inside the last slice fed
        rest = view[pos:]
        if not rest or (members and not rest.tobytes().strip(b"\0")):
            return  # done (gzip tolerates zero padding after the last member, like Python's gzip module)
        if not (members and rest[:2] == _GZIP_MAGIC):
            raise DecodeError(f"the {sink.encoding} body of {format_size(len(raw))} has {len(rest)} bytes after its end")


def _unbrotli(raw: bytes, sink: _Sink) -> None:
    # The decoder keeps the input it has not decoded yet; empty calls take out the rest, a step at a time.
    d = brotli.Decompressor()
    out = d.process(raw, output_buffer_limit=min(_OUT_STEP, sink.room))
    while out:
        sink.add(out)
        out = d.process(b"", output_buffer_limit=min(_OUT_STEP, sink.room)) if not d.is_finished() else b""
    if not d.is_finished():
        raise DecodeError(f"the br body of {format_size(len(raw))} is truncated")


def _unzstd(raw: bytes, sink: _Sink) -> None:
    view = memoryview(raw)
    pos = 0
    while True:  # one frame after another
        d = zstandard.ZstdDecompressor().decompressobj()
        while not d.eof:
            if pos >= len(raw):
                raise DecodeError(f"the zstd body of {format_size(len(raw))} is truncated")
            step = min(_IN_STEP, max(_ZSTD_MIN_IN, sink.room // _ZSTD_MAX_RATIO))
            chunk = view[pos : pos + step]
            pos += len(chunk)
            sink.add(d.decompress(chunk))
        pos -= len(d.unused_data)
        if pos >= len(raw):
            return


def _codec_reason(exc: Exception) -> str:
    """The codec's own words, cut short: they describe the stream, never quote it."""
    return str(exc).strip()[:120] or type(exc).__name__
