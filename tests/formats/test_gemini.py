"""formats.gemini: both spellings of inline data (and google-genai's mix of them), images inside a function
response, and new bytes under whichever spelling the part used."""

from __future__ import annotations

from trimflow.formats import FORMATS
from trimflow.testing import b64

from .cases import CASES, JPEG, PNG

GEMINI = FORMATS["gemini"]
NEW = b64(JPEG)


def test_a_placeholder_inside_a_function_response_keeps_the_response() -> None:
    body, _ = CASES["gemini"]
    out = GEMINI.replace_media(body, {("contents", 2, "parts", 0, "functionResponse", "parts", 0): "[gone]"})
    response = out["contents"][2]["parts"][0]["functionResponse"]
    assert response["parts"] == [{"text": "[gone]"}] and response["name"] == "shot"


def test_mixed_spellings_from_google_genai() -> None:
    # google-genai sends inlineData with a snake_case mime_type; a rewrite keeps what it found.
    body = {
        "contents": [
            {
                "role": "user",
                "parts": [
                    {"inlineData": {"data": b64(PNG), "mime_type": "image/png"}},
                    {"file_data": {"mimeType": "image/jpeg", "file_uri": "gs://b/x"}},
                ],
            }
        ]
    }
    found = GEMINI.find_media(body)
    assert [(m.kind, m.declared_mime) for m in found] == [("image", "image/png"), ("image", None)]
    out = GEMINI.replace_data(body, {("contents", 0, "parts", 0): (NEW, "image/jpeg")})
    assert out["contents"][0]["parts"][0] == {"inlineData": {"data": NEW, "mime_type": "image/jpeg"}}


def test_new_bytes_keep_each_parts_own_spelling() -> None:
    gem = {
        "contents": [
            {"parts": [{"inlineData": {"mimeType": "image/png", "data": "AAAA"}}, {"inline_data": {"mime_type": "image/png", "data": "AAAA"}}]}
        ]
    }
    out = GEMINI.replace_data(gem, {("contents", 0, "parts", 0): (NEW, "image/jpeg"), ("contents", 0, "parts", 1): (NEW, "image/jpeg")})
    assert out["contents"][0]["parts"] == [
        {"inlineData": {"mimeType": "image/jpeg", "data": NEW}},
        {"inline_data": {"mime_type": "image/jpeg", "data": NEW}},
    ]
