"""The screenshot that stands where a pruned OpenAI computer-use screenshot was.

A Responses `computer_call_output` must carry a `computer_screenshot`: no text part may take its place. So a
pruned one becomes a small image showing the placeholder's text (a "card"). Every card is a one-bit PNG of
the same size whose first chunks are fixed, so its base64 starts with CARD_PREFIX: the format finds cards by
that prefix and never counts, prunes or shrinks one again (running on its own output changes nothing).
Same text, same bytes: the card is deterministic for a given Pillow build, like the shrunk images.
"""

from __future__ import annotations

import base64
import functools
import io
import zlib

from PIL import Image, ImageDraw, ImageFont

__all__ = ["CARD_HEIGHT", "CARD_MIME", "CARD_PREFIX", "CARD_WIDTH", "card", "is_card"]

CARD_WIDTH, CARD_HEIGHT = 720, 20
CARD_MIME = "image/png"
_MARK = b"trimflow\x00placeholder"


def _chunk(kind: bytes, data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")


# PNG signature, IHDR (720x20, bit depth 1, greyscale) and the marking tEXt chunk: 33 + 35 bytes, then IDAT.
_HEAD = (
    b"\x89PNG\r\n\x1a\n"
    + _chunk(b"IHDR", CARD_WIDTH.to_bytes(4, "big") + CARD_HEIGHT.to_bytes(4, "big") + bytes((1, 0, 0, 0, 0)))
    + _chunk(b"tEXt", _MARK)
)
# Base64 of the whole fixed head but its last partial group of 3 bytes: what every card's payload starts with.
CARD_PREFIX = base64.b64encode(_HEAD[: len(_HEAD) - len(_HEAD) % 3]).decode("ascii")


def is_card(payload: str) -> bool:
    """Whether a base64 payload is a card this module made."""
    return payload.startswith(CARD_PREFIX)


@functools.lru_cache(maxsize=256)  # a session repeats the same placeholders turn after turn
def card(text: str) -> str:
    """Base64 of the card showing `text` (cut at the card's width)."""
    im = Image.new("1", (CARD_WIDTH, CARD_HEIGHT), 1)
    ImageDraw.Draw(im).text((4, 4), text, fill=0, font=ImageFont.load_default(size=11))
    pixels = io.BytesIO()
    im.save(pixels, "PNG", optimize=False, compress_level=9)
    raw = pixels.getvalue()
    # Pillow writes signature, IHDR, then the data: put the marking chunk right after IHDR.
    if raw[:33] != _HEAD[:33]:
        raise ValueError("Pillow wrote an unexpected PNG header for a card")
    return base64.b64encode(_HEAD + raw[33:]).decode("ascii")
