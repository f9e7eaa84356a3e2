"""Limit profiles: the shipped answers against the providers' real texts, every limit at its boundary,
file errors with file:line, and the addon's trimflow_simulate / trimflow_profiles options."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from mitmproxy import exceptions, http
from mitmproxy.test import taddons, tflow, tutils

from trimflow import proxy
from trimflow._limit_profiles import (
    DEFAULT_PROFILES_PATH,
    ProfilesError,
    UnknownProfile,
    check,
    check_request,
    image_path,
    load_profiles,
    parse_profiles,
    provider_check,
    select_profile,
)
from trimflow.formats import anthropic
from trimflow.testing import PATHS, b64, image, session_body

from .helpers import ROOT, TrimflowAddons, requested

PROFILES = load_profiles()
PNG = image(16, 16, "PNG", seed=1)  # a real, tiny image

# The error texts users hit, verbatim from docs/providers.md ("Error texts users hit").
# Each shipped profile must reproduce its text exactly when fed a request with the same numbers.
PROVIDER_TEXTS = {
    "anthropic-413": '{"type":"error","error":{"type":"request_too_large","message":"Request exceeds the maximum size"}}',
    "anthropic-5mb": "messages.0.content.2.image.source.base64: image exceeds 5 MB maximum: 15908784 bytes > 5242880 bytes",
    "anthropic-8000px": "messages.7.content.2.image.source.base64.data: At least one of the image dimensions exceed max allowed size: 8000 pixels",
    "anthropic-many-image": ": At least one of the image dimensions exceed max allowed size for many-image requests: 2000 pixels",
    "anthropic-media": "too many images and documents: 104 + 1 > 100",
    "bedrock": "too many images and documents: 21 + 0 > 20",
    "copilot": "too many images: maximum allowed for model gemini-3.1-pro-preview is 10, got 11",
    "gateway-8": "Max images exceeded",
    "axum": "Failed to buffer the request body: length limit exceeded",
    "cloudflare": "413 Request Entity Too Large",
    "gemini-cli": "Maximum request body size 1048576 exceeded, actual body size 1056562",
    "opencode-50": "request contains 52 images, exceeding the maximum of 50 allowed per request",
}

SHIPPED = (
    "axum-2mb",
    "anthropic-32mb",
    "anthropic-100-media",
    "anthropic-image-5mb",
    "anthropic-image-8000px",
    "anthropic-many-image-2000px",
    "copilot-gemini-10",
    "generic-8",
    "bedrock-20",
    "azure-50",
    "cloudflare-413",
    "gemini-cli-1mb",
)


# --- request builders --------------------------------------------------------------------------


def image_block(data: bytes = PNG) -> dict:
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(data)}}


def document_block() -> dict:
    return {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": b64(b"%PDF-1.4\n%%EOF\n")}}


def anthropic_request(*messages: list[dict]) -> bytes:
    return orjson.dumps({"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": blocks} for blocks in messages]})


def images(fmt: str, n: int, model: str | None = None) -> bytes:
    return orjson.dumps(session_body(fmt, n, PNG, "image/png", model))


def body_of_size(n: int) -> bytes:
    """A JSON request body of exactly n bytes."""
    empty = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": ""}]})
    return orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * (n - len(empty))}]})


def padded_png(raw_bytes: int) -> bytes:
    """A real PNG grown to exactly `raw_bytes` with bytes after its end, which decoders ignore."""
    return PNG + b"\0" * (raw_bytes - len(PNG))


def run(name: str, body: bytes, fmt: str = "openai-chat", path: str | None = None):
    return check_request(PROFILES.get(name), path or PATHS[fmt], body)


def message_of(body: bytes) -> str:
    data = orjson.loads(body)
    return data["error"]["message"] if "error" in data else data["message"]


# --- the shipped file --------------------------------------------------------------------------


def test_every_required_profile_ships() -> None:
    assert DEFAULT_PROFILES_PATH == ROOT / "rules" / "profiles.yaml"
    assert set(SHIPPED) <= set(PROFILES.names())


def test_every_shipped_profile_cites_providers_md() -> None:
    lines = DEFAULT_PROFILES_PATH.read_text().splitlines()
    for profile in PROFILES.profiles.values():
        comment = []
        for line in reversed(lines[: profile.line - 1]):
            if not line.strip().startswith("#"):
                break
            comment.append(line)
        assert any("[providers" in c for c in comment), f"{profile.name} has no [providers] comment above it"


# --- each answer against the provider's text, with the numbers of the real report ----------------


def test_axum_2mb_answers_axums_plain_413() -> None:
    assert run("axum-2mb", body_of_size(2 * 1024 * 1024)) is None  # exactly 2 MiB passes
    v = run("axum-2mb", body_of_size(2 * 1024 * 1024 + 1))
    assert (v.status, v.content_type, v.limit) == (413, "text/plain; charset=utf-8", "max_body_bytes")
    assert v.body.decode() == PROVIDER_TEXTS["axum"]
    assert f"{v.status} {v.body.decode()}" == "413 Failed to buffer the request body: length limit exceeded"


def test_anthropic_32mb_answers_request_too_large() -> None:
    assert run("anthropic-32mb", body_of_size(32 * 1024 * 1024), "anthropic") is None
    v = run("anthropic-32mb", body_of_size(32 * 1024 * 1024 + 1), "anthropic")
    assert (v.status, v.content_type) == (413, "application/json")
    assert v.body.decode() == PROVIDER_TEXTS["anthropic-413"]


def test_anthropic_100_media_counts_images_and_documents() -> None:
    profile = "anthropic-100-media"
    assert run(profile, anthropic_request([image_block()] * 100), "anthropic") is None
    assert run(profile, anthropic_request([image_block()] * 99 + [document_block()]), "anthropic") is None
    assert run(profile, anthropic_request([image_block()] * 100 + [document_block()]), "anthropic") is not None
    v = run(profile, anthropic_request([image_block()] * 104 + [document_block()]), "anthropic")
    assert (v.status, v.content_type, v.limit) == (400, "application/json", "max_media")
    assert orjson.loads(v.body) == {"type": "error", "error": {"type": "invalid_request_error", "message": PROVIDER_TEXTS["anthropic-media"]}}


def test_anthropic_image_5mb_names_the_image_and_its_base64_length() -> None:
    profile = "anthropic-image-5mb"
    text = {"type": "text", "text": "look"}
    at_limit = padded_png(5 * 1024 * 1024 * 3 // 4)  # base64 of exactly 5,242,880 characters
    assert len(b64(at_limit)) == 5_242_880
    assert run(profile, anthropic_request([text, text, image_block(at_limit)]), "anthropic") is None
    over = padded_png(5 * 1024 * 1024 * 3 // 4 + 1)  # base64 grows in steps of 4: 5,242,884
    assert run(profile, anthropic_request([text, text, image_block(over)]), "anthropic") is not None

    huge = padded_png(15_908_784 * 3 // 4)
    v = run(profile, anthropic_request([text, text, image_block(huge)]), "anthropic")
    assert (v.status, v.content_type, v.limit) == (400, "application/json", "max_image_base64_bytes")
    assert orjson.loads(v.body) == {"type": "error", "error": {"type": "invalid_request_error", "message": PROVIDER_TEXTS["anthropic-5mb"]}}


def test_anthropic_paths_follow_tool_results_like_anthropics_errors() -> None:
    # "messages.168.content.0.tool_result.content.1.image.source.base64: image exceeds 5 MB maximum"
    body = {
        "messages": [
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "shot"}, image_block()]}]}
        ]
    }
    (media,) = anthropic.find_media(body)
    assert image_path(body, media.path) == "messages.0.content.0.tool_result.content.1.image"


def test_anthropic_image_8000px_reads_the_pixel_size_from_the_image() -> None:
    profile = "anthropic-image-8000px"
    filler = [[{"type": "text", "text": f"turn {i}"}] for i in range(7)]
    text = {"type": "text", "text": "look"}
    wide = image(8000, 2, "PNG", seed=2)
    assert run(profile, anthropic_request(*filler, [text, text, image_block(wide)]), "anthropic") is None
    wider = image(8001, 2, "PNG", seed=2)
    v = run(profile, anthropic_request(*filler, [text, text, image_block(wider)]), "anthropic")
    assert (v.status, v.limit) == (400, "max_image_side")
    assert orjson.loads(v.body)["error"] == {"type": "invalid_request_error", "message": PROVIDER_TEXTS["anthropic-8000px"]}


def test_anthropic_many_image_2000px_applies_over_20_images() -> None:
    profile = "anthropic-many-image-2000px"
    big, edge = image(2001, 2, "PNG", seed=3), image(2, 2000, "PNG", seed=3)
    assert run(profile, anthropic_request([image_block()] * 19 + [image_block(big)]), "anthropic") is None  # 20 images
    assert run(profile, anthropic_request([image_block()] * 20 + [image_block(edge)]), "anthropic") is None  # 2000 px
    v = run(profile, anthropic_request([image_block()] * 20 + [image_block(big)]), "anthropic")
    assert (v.status, v.limit) == (400, "many_images_max_side")
    message = orjson.loads(v.body)["error"]["message"]
    assert message == "messages.0.content.20.image.source.base64.data" + PROVIDER_TEXTS["anthropic-many-image"]


def test_copilot_gemini_10_names_the_model_from_the_url() -> None:
    path = "/v1beta/models/gemini-3.1-pro-preview:generateContent"
    assert run("copilot-gemini-10", images("gemini", 10), "gemini", path) is None
    v = run("copilot-gemini-10", images("gemini", 11), "gemini", path)
    assert (v.status, v.content_type, v.limit) == (400, "application/json", "max_images")
    assert message_of(v.body) == PROVIDER_TEXTS["copilot"]


def test_generic_8_answers_max_images_exceeded() -> None:
    assert run("generic-8", images("openai-chat", 8)) is None
    v = run("generic-8", images("openai-chat", 9))
    assert (v.status, v.content_type) == (400, "application/json")
    assert message_of(v.body) == PROVIDER_TEXTS["gateway-8"]


def test_bedrock_20_counts_converse_images() -> None:
    assert run("bedrock-20", images("bedrock-converse", 20), "bedrock-converse") is None
    v = run("bedrock-20", images("bedrock-converse", 21), "bedrock-converse")
    assert (v.status, v.content_type) == (400, "application/json")
    assert orjson.loads(v.body) == {"message": PROVIDER_TEXTS["bedrock"]}


def test_azure_50_fills_in_the_count() -> None:
    assert run("azure-50", images("openai-chat", 50)) is None
    v = run("azure-50", images("openai-chat", 52))
    assert (v.status, v.content_type) == (400, "application/json")
    assert orjson.loads(v.body)["error"] == {"message": PROVIDER_TEXTS["opencode-50"], "type": "invalid_request_error"}


def test_cloudflare_413_answers_its_html_page() -> None:
    assert run("cloudflare-413", body_of_size(50 * 1024 * 1024)) is None
    v = run("cloudflare-413", body_of_size(50 * 1024 * 1024 + 1))
    assert (v.status, v.content_type) == (413, "text/html")
    page = v.body.decode()
    assert f"<title>{PROVIDER_TEXTS['cloudflare']}</title>" in page and "<center>cloudflare</center>" in page


def test_gemini_cli_1mb_reports_the_actual_size() -> None:
    assert run("gemini-cli-1mb", body_of_size(1_048_576), "gemini") is None
    v = run("gemini-cli-1mb", body_of_size(1_056_562), "gemini")
    assert (v.status, v.content_type) == (413, "application/json")
    assert orjson.loads(v.body) == {"error": {"message": PROVIDER_TEXTS["gemini-cli"], "code": 413, "status": "Request Entity Too Large"}}


# --- the check itself --------------------------------------------------------------------------


def test_the_first_broken_limit_answers() -> None:
    profiles = parse_profiles(
        "profiles:\n"
        "  both:\n"
        "    max_body_bytes: 1000\n"
        "    max_images: 1\n"
        "    status: 400\n"
        "    content_type: text/plain\n"
        "    body: '{limit} {images} {body_bytes} {image_path}'\n"
    )
    body = images("openai-chat", 2)
    v = check_request(profiles.get("both"), PATHS["openai-chat"], body)
    assert v.limit == "max_body_bytes"  # the body limit comes first
    assert v.body.decode() == f"1000 2 {len(body)} ?"


def test_a_body_that_is_not_json_is_checked_for_size_only() -> None:
    assert run("generic-8", b"not json at all") is None
    assert run("axum-2mb", b"x" * (2 * 1024 * 1024 + 1)).status == 413
    assert check(PROFILES.get("generic-8"), b"{}") is None


def test_remote_images_count_but_have_no_size() -> None:
    body = orjson.dumps(
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"https://example.test/{i}.png"}} for i in range(9)]}
            ],
        }
    )
    assert run("generic-8", body).limit == "max_images"
    assert run("anthropic-image-8000px", body) is None


def test_provider_check_answers_posts_only() -> None:
    class Request:
        def __init__(self, method: str, body: bytes) -> None:
            self.method, self.path, self.body = method, PATHS["openai-chat"], body

    hook = provider_check(PROFILES.get("generic-8"))
    assert hook(Request("POST", images("openai-chat", 8))) is None
    status, content_type, body = hook(Request("POST", images("openai-chat", 9)))
    assert (status, content_type, message_of(body)) == (400, "application/json", "Max images exceeded")
    assert hook(Request("GET", images("openai-chat", 9))) is None


# --- profile files with errors -----------------------------------------------------------------

GOOD = """\
profiles:
  mine:
    max_images: 3
    status: 400
    content_type: application/json
    body: {error: {message: "too many: {images} > {limit}"}}
"""


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        (GOOD.replace("max_images: 3", "max_imagse: 3"), 3, "unknown field 'max_imagse' in profile 'mine'; did you mean 'max_images'?"),
        (GOOD.replace("max_images: 3", "max_images: -1"), 3, "max_images must be a whole number >= 0, got -1"),
        (GOOD.replace("max_images: 3", "max_body_bytes: 2 lightyears"), 3, "max_body_bytes: invalid size '2 lightyears'"),
        (GOOD.replace("status: 400", "status: 200"), 4, "status must be an HTTP error status (400-599), got 200"),
        (GOOD.replace("{images}", "{imgs}"), 6, "unknown field {imgs}; did you mean 'images'?"),
        (GOOD.replace("{images}", "{image_bytes:,}"), 6, "are '?' when the broken limit is not about one image"),
        (GOOD.replace("application/json", "text/plain"), 6, "a mapping or list body is sent as JSON, but content_type is 'text/plain'"),
        (GOOD.replace('    body: {error: {message: "too many: {images} > {limit}"}}\n', ""), 3, "profile 'mine' has no body"),
        (GOOD.replace("max_images: 3", "many_images_threshold: 20"), 3, "many_images_threshold needs many_images_max_side too"),
        (GOOD.replace("    max_images: 3\n", ""), 3, "profile 'mine' has no limit"),
        (GOOD.replace("  mine:", '  "off":'), 2, "profile name 'off' is reserved"),
        (GOOD + GOOD.replace("profiles:\n", ""), 7, "duplicate key 'mine' in profiles (first on line 2)"),
        (GOOD.replace("status: 400", "status: [400"), 5, "YAML syntax error"),
        ("rules: []\n", 1, "unknown top-level key 'rules' in the profiles file"),
        ("", 1, "empty profiles file"),
    ],
)
def test_a_bad_profiles_file_is_refused_with_file_line_and_problem(tmp_path, text: str, line: int, problem: str) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    with pytest.raises(ProfilesError) as caught:
        load_profiles(path)
    assert caught.value.line == line
    assert problem in caught.value.problem
    assert str(caught.value).startswith(f"{path}:{line}: ")


def test_profiles_share_answers_through_x_anchors_and_merge_keys() -> None:
    text = """\
x-gateway: &gateway
  status: 400
  content_type: application/json
  body: {error: {message: "at most {limit}"}}
profiles:
  eight: {<<: *gateway, max_images: 8}
  nine: {<<: *gateway, max_images: 9, status: 413}
"""
    profiles = parse_profiles(text, "shared.yaml")
    assert (profiles.get("eight").status, profiles.get("eight").max_images) == (400, 8)
    assert (profiles.get("nine").status, profiles.get("nine").content_type) == (413, "application/json")


def test_a_missing_profiles_file_names_the_file(tmp_path) -> None:
    with pytest.raises(ProfilesError, match=r"nope\.yaml: cannot read"):
        load_profiles(tmp_path / "nope.yaml")


def test_an_unknown_profile_lists_the_known_names() -> None:
    with pytest.raises(UnknownProfile) as caught:
        PROFILES.get("axum-2mib")
    message = str(caught.value)
    assert "unknown profile 'axum-2mib'" in message and "did you mean 'axum-2mb'?" in message
    assert all(name in message for name in SHIPPED)
    assert select_profile("off") is None
    assert select_profile("generic-8").max_images == 8


# --- the addon's options -----------------------------------------------------------------------


def test_simulate_is_off_by_default_and_validated(tmp_path) -> None:
    addon = TrimflowAddons()
    with taddons.context(addon) as tctx:
        tctx.configure(addon)
        assert tctx.options.trimflow_simulate == "off" and addon.simulated is None
        assert Path(tctx.options.trimflow_profiles) == DEFAULT_PROFILES_PATH
        with pytest.raises(exceptions.OptionsError, match=r"unknown profile 'nope'.*known: axum-2mb, "):
            tctx.configure(addon, trimflow_simulate="nope")
        bad = tmp_path / "bad.yaml"
        bad.write_text(GOOD.replace("status: 400", "status: 200"))
        with pytest.raises(exceptions.OptionsError, match=rf"{bad}:4: status must be an HTTP error status"):
            tctx.configure(addon, trimflow_simulate="mine", trimflow_profiles=str(bad))
        tctx.configure(addon, trimflow_simulate="generic-8", trimflow_profiles=str(DEFAULT_PROFILES_PATH))
        assert addon.simulated.name == "generic-8"


@pytest.mark.parametrize(("mode", "answered"), [("observe", True), ("enforce", False)])
async def test_the_addon_answers_for_the_provider_when_the_forwarded_request_breaks_the_profile(tmp_path, mode: str, answered: bool) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("defaults:\n  max_images: 8\n  keep_recent: 1\n")
    addon = TrimflowAddons()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, trimflow_rules=str(rules), trimflow_mode=mode, trimflow_simulate="generic-8")
        request = tutils.treq(
            host="api.openai.com",
            port=443,
            scheme=b"https",
            method=b"POST",
            authority=b"",
            path=PATHS["openai-chat"].encode(),
            content=images("openai-chat", 9),
            headers=http.Headers(content_type="application/json"),
        )
        flow = tflow.tflow(req=request)
        await requested(addon, flow)
        record = flow.metadata[proxy.META]
        if answered:  # observe forwards 9 images: the gateway's cap of 8 refuses them
            assert flow.response.status_code == 400
            assert flow.response.headers["content-type"] == "application/json"
            assert message_of(flow.response.content) == "Max images exceeded"
            assert (record["simulated"], record["status"]) == ("generic-8", 400)
        else:  # enforce prunes to 8 first: the request goes upstream
            assert flow.response is None
            assert record["simulated"] is None and record["images_after"] == 8
