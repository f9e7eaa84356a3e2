"""trimflow._media, the vocabulary the formats, the policy and the engine share: base64 data URLs split without
copying and written back, and a MIME type's kind."""

from __future__ import annotations

import pytest

from trimflow._media import DOCUMENT, IMAGE, Media, data_url, kind_of_mime, split_data_url


@pytest.mark.parametrize(
    ("url", "want"),
    [
        ("data:image/png;base64,AAAA", ("image/png", 22)),
        ("data:image/jpeg;name=shot.jpg;base64,/9j/", ("image/jpeg", 37)),
        ("data:;base64,AAAA", (None, 13)),
        ("data:image/png;base64,", ("image/png", 22)),
        ("data:image/png,AAAA", None),  # not base64
        ("data:text/plain;charset=utf-8,hello", None),
        ("data:image/png;base64", None),  # no comma
        ("https://example.com/a.png", None),
        ("", None),
    ],
)
def test_split_data_url(url: str, want: tuple[str | None, int] | None) -> None:
    assert split_data_url(url) == want
    if want is not None:
        assert url[want[1] - 1] == ","  # the offset is where the payload starts


def test_a_data_url_header_is_looked_for_only_near_the_start() -> None:
    # A comma deep in a long non-base64 URL is no header: the search stops early instead of scanning megabytes.
    assert split_data_url("data:" + "x" * 600 + ";base64,AAAA") is None


def test_data_url_writes_what_split_data_url_reads() -> None:
    url = data_url("QUJD", "image/webp")
    assert url == "data:image/webp;base64,QUJD"
    mime, offset = split_data_url(url) or (None, 0)
    assert (mime, url[offset:]) == ("image/webp", "QUJD")


@pytest.mark.parametrize(
    ("mime", "kind"),
    [
        ("image/png", "image"),
        ("IMAGE/JPEG", "image"),
        ("audio/wav", "audio"),
        ("video/mp4", "video"),
        ("application/pdf", DOCUMENT),
        ("text/plain", DOCUMENT),
        ("image", "image"),
        ("", DOCUMENT),
        (None, DOCUMENT),
    ],
)
def test_kind_of_mime(mime: str | None, kind: str) -> None:
    assert kind_of_mime(mime) == kind


def test_a_payload_is_measured_without_its_data_url_header() -> None:
    url = data_url("QUJD" * 10, "image/png")
    assert Media(IMAGE, (), url, url.index(",") + 1).payload_bytes == 40
    assert Media(IMAGE, (), "QUJD" * 10).payload_bytes == 40
    assert Media(IMAGE, (), None).payload_bytes == 0  # remote: no bytes here
