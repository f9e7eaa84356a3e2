"""formats._card: the card that stands where a pruned computer-use screenshot was."""

from __future__ import annotations

import base64
import io

from PIL import Image

from trimflow.formats._card import CARD_HEIGHT, CARD_PREFIX, CARD_WIDTH, card, is_card
from trimflow.testing import b64, image


def test_a_card_is_a_small_one_bit_png_showing_its_text() -> None:
    payload = card("[trimflow: image #4 omitted (image/png, 5120x2880, 14.1MB)]")
    with Image.open(io.BytesIO(base64.b64decode(payload))) as im:
        assert (im.format, im.mode, im.size) == ("PNG", "1", (CARD_WIDTH, CARD_HEIGHT))
        ink = im.convert("L").histogram()[0]  # pixels of value 0
    assert 200 < ink < CARD_WIDTH * CARD_HEIGHT // 4  # text drawn, not a filled block
    assert len(payload) < 1500


def test_cards_are_deterministic_and_known_by_their_prefix() -> None:
    assert card("a") == card("a") != card("b")
    assert is_card(card("a")) and card("b").startswith(CARD_PREFIX)


def test_ordinary_images_are_not_cards() -> None:
    blank = io.BytesIO()
    Image.new("1", (CARD_WIDTH, CARD_HEIGHT), 1).save(blank, "PNG")  # the same size and mode, but no marking chunk
    for payload in (b64(blank.getvalue()), b64(image(64, 48, "PNG")), "", CARD_PREFIX[:40]):
        assert not is_card(payload)
