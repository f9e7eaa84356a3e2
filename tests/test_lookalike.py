"""Screenshots that show the same screen (trimflow._lookalike): the same screen with the cursor moved, the clock on or a
spinner at another frame matches, no two distinct screens do; thumbnails are made only when asked, and kept."""

from __future__ import annotations

import itertools

import orjson
import pytest

from trimflow import NeedsWorker, _shrink, prune
from trimflow._history import image_key
from trimflow._imageinfo import sniff_media
from trimflow._lookalike import THUMBNAIL, THUMBNAILS, NeedsThumbnails, Thumbnails, lookalikes, same_screen, thumbnail
from trimflow._media import IMAGE, TOOL, USER, Media
from trimflow._placeholder import MediaFacts
from trimflow._rules_file import DEFAULT_RULES_PATH, load_rules
from trimflow.testing import b64, image
from trimflow.testing._screens import CHANGES, agent_session, app_screen, distinct_screens

from .research.cache_sessions import desktop_screenshot

SIZES = [(640, 400), (1280, 800)]


def thumb(data: bytes) -> bytes:
    made = thumbnail(b64(data))
    assert made is not None and len(made) == THUMBNAIL[0] * THUMBNAIL[1]
    return made


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("change", CHANGES)
@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_the_same_screen_a_moment_later_is_the_same_screen(size: tuple[int, int], change: str, fmt: str) -> None:
    for seed in range(3):
        base = thumb(app_screen(seed, size, fmt=fmt))
        for variant in (1, 4):
            assert same_screen(base, thumb(app_screen(seed, size, variant, change, fmt=fmt))), (seed, variant)


@pytest.mark.parametrize("size", SIZES)
def test_no_two_distinct_screens_look_alike(size: tuple[int, int]) -> None:
    """Other pages of one app, the same page scrolled, a dialog open, other apps: not one false match."""
    thumbs = [thumb(s) for s in distinct_screens(24, size)]
    assert [pair for pair in itertools.combinations(range(len(thumbs)), 2) if same_screen(thumbs[pair[0]], thumbs[pair[1]])] == []


def test_the_reference_sessions_screens_are_all_distinct() -> None:
    thumbs = [thumb(desktop_screenshot(seed)) for seed in range(12)]
    assert not any(same_screen(a, b) for a, b in itertools.combinations(thumbs, 2))


def test_an_image_that_cannot_be_decoded_has_no_thumbnail() -> None:
    assert thumbnail("not base64!") is None
    assert thumbnail(b64(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)) is None


def screenshots(*shots: tuple[bytes, str]) -> tuple[list[MediaFacts], list[bytes]]:
    media = [Media(IMAGE, ("messages", i), b64(data), origin=origin) for i, (data, origin) in enumerate(shots)]
    return [MediaFacts(m, i + 1, sniff_media(m)) for i, m in enumerate(media)], [image_key(m) for m in media]


def test_a_thumbnail_is_decoded_within_the_shrinks_budget_or_not_at_all() -> None:
    """Thumbnails share the process-wide decoding budget with shrinking: with no room, the image is not compared."""
    payload = b64(app_screen(0, size=(1280, 800)))
    assert thumbnail(payload) is not None and _shrink.BUDGET.reserved == 0  # given back
    held = _shrink.BUDGET.limit
    assert _shrink.BUDGET.reserve(held)
    try:
        waits, _shrink.BUDGET.wait = _shrink.BUDGET.wait, 0.0
        assert thumbnail(payload) is None
    finally:
        _shrink.BUDGET.wait = waits
        _shrink.BUDGET.release(held)


def test_a_look_alike_is_a_screenshot_showing_the_same_screen_as_the_image_right_after_it() -> None:
    a, a_later, b = app_screen(1, (320, 200)), app_screen(1, (320, 200), 2, "clock"), app_screen(2, (320, 200))
    facts, keys = screenshots((a, TOOL), (a_later, TOOL), (b, TOOL), (a, TOOL), (a, USER), (a, TOOL), (a, TOOL))
    cache = Thumbnails()
    # 0: the same screen after it; 1: another after it; 3: the user's after it; 4: the user's own; 5: the same bytes after it
    assert lookalikes(facts, range(7), keys, make=True, cache=cache) == {0, 5}
    smaller = image(160, 100, "PNG", seed=1)
    facts, keys = screenshots((app_screen(1, (320, 200)), TOOL), (smaller, TOOL))
    assert lookalikes(facts, [0], keys, make=True, cache=cache) == set()  # other dimensions: another screen


def test_thumbnails_are_made_when_asked_kept_by_key_and_bounded() -> None:
    shots = [(app_screen(seed, (320, 200)), TOOL) for seed in range(4)]
    facts, keys = screenshots(*shots)
    cache = Thumbnails(capacity=3)
    with pytest.raises(NeedsThumbnails):
        lookalikes(facts, [0], keys, make=False, cache=cache)  # inline: nothing made
    assert cache.made == 0
    lookalikes(facts, [0, 1], keys, make=True, cache=cache)
    assert cache.made == 3 and len(cache) == 3
    assert lookalikes(facts, [1], keys, make=False, cache=cache) == set()  # kept: none made, none needed
    lookalikes(facts, [2], keys, make=True, cache=cache)
    assert cache.made == 4 and len(cache) == 3  # the least recently used forgotten


def test_an_image_past_the_pixel_bound_is_never_decoded_for_a_thumbnail(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("trimflow._lookalike.MAX_PIXELS", 320 * 200 - 1)
    shot = app_screen(1, (320, 200))
    facts, keys = screenshots((shot, TOOL), (shot, TOOL), (app_screen(2, (320, 200)), TOOL))
    cache = Thumbnails()
    assert lookalikes(facts, [0, 1], keys, make=True, cache=cache) == set() and cache.made == 0


def test_on_the_event_loop_a_thumbnail_to_make_sends_the_request_to_a_worker() -> None:
    """The engine inline (the proxy's loop) never decodes: a turn whose cut moves over screenshots with no thumbnail
    kept raises NeedsWorker; in the worker they are made, and kept for the next time."""
    shots = [app_screen(500 + k, (320, 200)) for k in range(9)]
    body = orjson.dumps(list(agent_session("anthropic", None, shots, "claude-sonnet-4-6"))[-1])
    rules = load_rules(DEFAULT_RULES_PATH)
    target = rules.target("api.example.test", "/v1/messages")
    assert target is not None
    with pytest.raises(NeedsWorker, match="thumbnail"):
        prune(target, {}, body, rules, inline=True)
    made = THUMBNAILS.made
    assert prune(target, {}, body, rules).record.pruned == 6
    assert THUMBNAILS.made > made
    assert prune(target, {}, body, rules, inline=True).record.pruned == 6  # kept: inline now
