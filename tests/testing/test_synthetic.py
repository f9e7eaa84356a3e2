"""trimflow.testing's synthetic sessions: real images of the size and type asked for, the same bytes for the
same seed, and whole-history bodies each format's own parser reads as the turns they claim to be."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from trimflow import builtin_rules
from trimflow.formats import FORMATS
from trimflow.testing import MIME, PATHS, b64, data_url, image, screenshot, session_body


@pytest.mark.parametrize("fmt", sorted(MIME))
def test_an_image_is_a_real_one_of_the_size_and_type_asked(fmt: str) -> None:
    im = Image.open(io.BytesIO(image(70, 40, fmt, seed=1)))
    im.load()
    assert (im.format, im.size) == (fmt, (70, 40))


def test_the_same_seed_gives_the_same_bytes_and_another_seed_others() -> None:
    assert image(50, 50, "PNG", seed=3) == image(50, 50, "PNG", seed=3)
    assert image(50, 50, "PNG", seed=3) != image(50, 50, "PNG", seed=4)


def test_noise_sets_how_well_an_image_compresses() -> None:
    flat, noisy = image(200, 200, "PNG", seed=5, noise=0.0), image(200, 200, "PNG", seed=5, noise=1.0)
    assert len(noisy) > 10 * len(flat)


@pytest.mark.parametrize(("kilobytes", "fmt"), [(20, "WEBP"), (200, "WEBP"), (100, "PNG"), (300, "JPEG")])
def test_a_screenshot_is_within_15_percent_of_its_size(kilobytes: int, fmt: str) -> None:
    data = screenshot(kilobytes, fmt)
    assert abs(len(data) - kilobytes * 1024) <= 0.15 * kilobytes * 1024, len(data)
    assert Image.open(io.BytesIO(data)).format == fmt


def test_b64_and_data_url() -> None:
    raw = image(8, 8, "GIF", seed=2)
    assert base64.b64decode(b64(raw)) == raw
    assert data_url(raw, "image/gif") == "data:image/gif;base64," + b64(raw)


def test_every_format_has_a_session_builder_and_a_path_the_built_in_rules_know() -> None:
    assert set(PATHS) == set(FORMATS)
    rules = builtin_rules()
    for fmt, path in PATHS.items():
        assert rules.format_for("api.example.test", path) == fmt, (fmt, path)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("turns", [1, 4])
def test_a_session_body_holds_every_turn_with_its_screenshot(fmt: str, turns: int) -> None:
    shot = image(30, 20, "PNG", seed=turns)
    body = session_body(fmt, turns, shot, "image/png")
    images = [m for m in FORMATS[fmt].find_media(body) if m.kind == "image"]
    assert len(images) == turns
    assert all(base64.b64decode(m.data[m.data_offset :]) == shot for m in images)
    assert all(m.declared_mime in ("image/png", None) for m in images)  # Ollama declares none
    text = str(body)
    for turn in range(1, turns + 1):
        assert f"Turn {turn}: here is my screen. What should I click next?" in text
    assert f"On turn {turns} I see" not in text  # the last turn awaits its answer
    assert "You are a desktop assistant." in text


def test_a_session_body_names_the_model_asked_for() -> None:
    shot = image(10, 10, "PNG", seed=0)
    for fmt in ("openai-chat", "openai-responses", "anthropic", "ollama"):
        assert FORMATS[fmt].model(session_body(fmt, 1, shot, "image/png", model="my-model"), PATHS[fmt]) == "my-model"
