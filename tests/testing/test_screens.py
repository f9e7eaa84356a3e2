"""The screens and agent sessions of trimflow.testing._screens: real images that differ where they should, and bodies
whose images sit where each format puts a user's attachment and a tool's output."""

from __future__ import annotations

import io

import pytest
from PIL import Image, ImageChops

from trimflow._media import IMAGE, USER
from trimflow.formats import FORMATS
from trimflow.testing import b64
from trimflow.testing._screens import CHANGES, agent_session, app_screen, distinct_screens, mockup


def pixels(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


@pytest.mark.parametrize("change", CHANGES)
def test_a_variant_is_the_same_screen_with_a_small_change(change: str) -> None:
    base, again = pixels(app_screen(3, (640, 400))), pixels(app_screen(3, (640, 400), 2, change))
    box = ImageChops.difference(base, again).getbbox()
    assert box is not None, "the variant changed nothing"
    left, top, right, bottom = box
    assert (right - left) * (bottom - top) < 640 * 400 // 20  # a small part of the screen
    assert app_screen(3, (640, 400), 2, change) == app_screen(3, (640, 400), 2, change)  # the same bytes each time


def test_distinct_screens_differ_from_each_other_over_much_of_the_screen() -> None:
    screens = [pixels(s) for s in distinct_screens(10, (640, 400))]
    for i, a in enumerate(screens):
        for b in screens[i + 1 :]:
            box = ImageChops.difference(a, b).getbbox()
            assert box is not None
            left, top, right, bottom = box
            assert (right - left) * (bottom - top) > 640 * 400 // 20


@pytest.mark.parametrize("fmt", ["anthropic", "openai-chat", "openai-responses", "gemini"])
def test_an_agent_session_sends_the_users_mock_up_then_a_screen_a_turn_from_a_tool(fmt: str) -> None:
    shots = [app_screen(k, (160, 100)) for k in range(3)]
    bodies = list(agent_session(fmt, mockup(), shots, "some-model"))
    assert len(bodies) == 4
    for turn, body in enumerate(bodies):
        found = [m for m in FORMATS[fmt].find_media(body) if m.kind == IMAGE]
        assert [m.data[m.data_offset :] for m in found if m.data is not None] == [b64(mockup()), *(b64(s) for s in shots[:turn])]
        assert [m.origin for m in found] == [USER] + [m.origin for m in found[1:] if m.origin != USER]
