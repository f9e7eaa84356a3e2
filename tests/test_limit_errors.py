"""Limit errors (trimflow._limit_errors): every shipped pattern against a real answer, what is never a limit error,
how a limit is tightened, and the patterns file's checks."""

from __future__ import annotations

import re

import orjson
import pytest

from trimflow import Limits, RulesError
from trimflow._limit_errors import (
    BODY_BYTES,
    IMAGE_BYTES,
    IMAGE_COUNT,
    IMAGE_SIDE,
    LimitError,
    Refused,
    Rejected,
    Tightening,
    assess,
    load_patterns,
    parse_patterns,
    scope,
    step_down,
    tightened,
    why_not,
)

PATTERNS = load_patterns()


def anthropic(message: str) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": "invalid_request_error", "message": message}, "request_id": "req_011CXyLbCw5kpB1Nsyko"})


def openai(message: str, kind: str = "invalid_request_error") -> bytes:
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}})


MANY_IMAGE_TEXT = (
    "messages.19.content.27.image.source.base64.data: "
    "At least one of the image dimensions exceed max allowed size for many-image requests: 2000 pixels"
)

# (status, the answer as the provider sends it, host, pattern, limit kind, the number) - texts from docs/providers.md.
REAL_ANSWERS = [
    (400, anthropic("too many images and documents: 104 + 1 > 100"), "api.anthropic.com", "anthropic-media-count", IMAGE_COUNT, 99),
    (400, anthropic("too many images and documents: 120 + 0 > 100"), "api.anthropic.com", "anthropic-media-count", IMAGE_COUNT, 100),
    (
        400,
        b'{"message":"too many images and documents: 21 + 0 > 20"}',
        "bedrock-runtime.us-east-1.amazonaws.com",
        "anthropic-media-count",
        IMAGE_COUNT,
        20,
    ),
    (400, anthropic("Too much media: 0 document pages + 103 images > 100"), "api.anthropic.com", "anthropic-too-much-media", IMAGE_COUNT, 100),
    (400, openai("27 + 0 > 20"), "openrouter.ai", "openrouter-media-count", IMAGE_COUNT, 20),
    (
        400,
        openai("too many images: maximum allowed for model gemini-3.1-pro-preview is 10, got 11"),
        "api.githubcopilot.com",
        "copilot-gemini-count",
        IMAGE_COUNT,
        10,
    ),
    (
        400,
        openai("Too many images in request: 11 images provided, but the model supports a maximum of 10 images."),
        "api.githubcopilot.com",
        "copilot-model-count",
        IMAGE_COUNT,
        10,
    ),
    (
        400,
        openai("The request contains too many images: 11 images were provided, but the model supports a maximum of 10 images."),
        "api.githubcopilot.com",
        "copilot-model-count",
        IMAGE_COUNT,
        10,
    ),
    (
        400,
        openai("request contains 52 images, exceeding the maximum of 50 allowed per request"),
        "example.openai.azure.com",
        "openai-compatible-count",
        IMAGE_COUNT,
        50,
    ),
    (400, openai("Too many images in request. Max is 10."), "api.example.com", "openai-max-is", IMAGE_COUNT, 10),
    (400, openai("Too many images in request: 11 > 8"), "gateway.example.com", "gateway-count-over", IMAGE_COUNT, 8),
    (400, openai("Too many images: 51, maximum allowed: 50"), "argo.example.com", "argo-count", IMAGE_COUNT, 50),
    (
        400,
        b'{"object":"error","message":"At most 5 image(s) may be provided in one request.","type":"BadRequestError","param":null,"code":400}',
        "localhost",
        "vllm-count",
        IMAGE_COUNT,
        5,
    ),
    (400, openai("At most 4 image(s) may be provided in one prompt."), "api.example.com", "vllm-count", IMAGE_COUNT, 4),
    (
        400,
        b'{"object":"error","message":"Image count 5 exceeds limit 4 per request.","type":"BadRequestError","param":null,"code":400}',
        "localhost",
        "litellm-count",
        IMAGE_COUNT,
        4,
    ),
    (
        400,
        b'{"error":{"code":400,"message":"You can only include 10 image links. Please reduce the number accordingly.","status":"INVALID_ARGUMENT"}}',
        "us-central1-aiplatform.googleapis.com",
        "vertex-image-links",
        IMAGE_COUNT,
        10,
    ),
    (400, openai("HTTP 400 \u2013 Max images exceeded"), "gateway.example.com", "max-images-exceeded", IMAGE_COUNT, None),
    (
        400,
        anthropic("messages.0.content.2.image.source.base64: image exceeds 5 MB maximum: 15908784 bytes > 5242880 bytes"),
        "api.anthropic.com",
        "anthropic-image-bytes",
        "image_bytes",
        5242880,
    ),
    (
        400,
        b'{"message":"ValidationException: messages.1.content.0.image.source.bytes: image exceeds 5 MB maximum: 7167852 bytes > 5242880 bytes"}',
        "bedrock-runtime.us-west-2.amazonaws.com",
        "anthropic-image-bytes",
        "image_bytes",
        5242880,
    ),
    (
        400,
        anthropic(MANY_IMAGE_TEXT),
        "api.anthropic.com",
        "anthropic-many-image-side",
        "many_image_side",
        2000,
    ),
    (
        400,
        anthropic("messages.7.content.2.image.source.base64.data: At least one of the image dimensions exceed max allowed size: 8000 pixels"),
        "api.anthropic.com",
        "anthropic-image-side",
        "image_side",
        8000,
    ),
    (
        400,
        openai(
            "The image you provided requires 33174 patches after processing, exceeding the limit of 30000. Please resize the image and try again."
        ),
        "chatgpt.com",
        "openai-image-patches",
        "image_side",
        5536,
    ),
    (
        400,
        b'{"type":"error","error":{"type":"invalid_request_error","message":"media exceeds size limit: max 10485760 bytes (2013)"}}',
        "api.minimax.io",
        "minimax-image-bytes",
        "image_bytes",
        10485760,
    ),
    (
        400,
        openai("String value length (20054016) exceeds the maximum allowed (20000000, from `StreamReadConstraints.getMaxStringLength()`)"),
        "dashscope.aliyuncs.com",
        "dashscope-string-length",
        "image_bytes",
        20000000,
    ),
    (
        400,
        b'{"detail":[{"type":"string_type","loc":["body","messages",3,"content","str"],"msg":"Input should be a valid string",'
        b'"input":[{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo"}}]}]}',
        "api.tokenfactory.nebius.com",
        "nebius-image-string",
        "image_bytes",
        10485760,
    ),
    (
        413,
        b'{"error":{"message":"Maximum request body size 1048576 exceeded, actual body size 1056562",'
        b'"code":413,"status":"Request Entity Too Large"}}',
        "cloudcode-pa.googleapis.com",
        "gemini-cli-body",
        BODY_BYTES,
        1048576,
    ),
    (
        400,
        b'{"error":{"code":400,"message":"Request payload size exceeds the limit: 314572800 bytes.","status":"INVALID_ARGUMENT"}}',
        "generativelanguage.googleapis.com",
        "gemini-payload",
        BODY_BYTES,
        314572800,
    ),
    (
        400,
        b'{"error":{"message":"Please make sure your payload is below 26214400 bytes in size. If larger assets are required please refer to our '
        b'Assets API.","type":"invalid_request_error","param":null,"code":"invalid_image_format"}}',
        "integrate.api.nvidia.com",
        "nvidia-payload",
        BODY_BYTES,
        26214400,
    ),
    (400, openai("Request size cannot exceed 8999999 bytes"), "api.example.com", "request-size-cannot-exceed", BODY_BYTES, 8999999),
    (
        413,
        b'{"type":"error","error":{"type":"request_too_large","message":"Request exceeds the maximum size"}}',
        "api.anthropic.com",
        "anthropic-request-too-large",
        BODY_BYTES,
        None,
    ),
    (413, b"Failed to buffer the request body: length limit exceeded", "backend.example.com", "bare-413", BODY_BYTES, None),
    (
        413,
        b"<html>\n<head><title>413 Request Entity Too Large</title></head>\n<body>\n<center><h1>413 Request Entity Too Large</h1></center>\n"
        b"<hr><center>cloudflare</center>\n</body>\n</html>\n",
        "chatgpt.com",
        "bare-413",
        BODY_BYTES,
        None,
    ),
    (
        413,
        b"<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body>\r\n<center><h1>413 Request Entity Too Large</h1></center>\r\n"
        b"<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n",
        "llm.example.com",
        "bare-413",
        BODY_BYTES,
        None,
    ),
    (413, b"", "llm.example.com", "bare-413", BODY_BYTES, None),
]


@pytest.mark.parametrize(("status", "body", "host", "name", "kind", "value"), REAL_ANSWERS, ids=[f"{r[3]}-{i}" for i, r in enumerate(REAL_ANSWERS)])
def test_every_shipped_pattern_reads_its_real_answer(status: int, body: bytes, host: str, name: str, kind: str, value: int | None) -> None:
    error = PATTERNS.recognise(status, body, host)
    assert error is not None
    assert (error.pattern.name, error.kind, error.value) == (name, kind, value)


def test_the_table_covers_every_shipped_pattern() -> None:
    assert {p.name for p in PATTERNS.patterns} == {row[3] for row in REAL_ANSWERS}


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (400, openai("The model `gpt-5-turbo-xl` does not exist or you do not have access to it.", "invalid_request_error")),
        (400, openai("We could not parse the JSON body of your request.")),
        (400, b'{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: Field required"}}'),
        (401, openai("Incorrect API key provided", "invalid_request_error")),
        (403, anthropic("too many images and documents: 104 + 1 > 100")),  # a limit's text under a status that never means one
        (404, b"Not Found"),
        (429, openai("Rate limit reached: too many images and documents: 104 + 1 > 100")),
        (500, openai("too many images in the message, max allowed is 16")),
        (502, b"<html><center>413 Request Entity Too Large</center></html>"),
        (200, b'{"id":"ok"}'),
    ],
)
def test_other_failures_are_no_limit_errors(status: int, body: bytes) -> None:
    assert PATTERNS.recognise(status, body, "api.example.com") is None


def test_a_host_bound_pattern_holds_for_its_host_only() -> None:
    body = b'{"detail":[{"type":"string_type","loc":["body","messages",3,"content","str"],"msg":"Input should be a valid string"}]}'
    assert PATTERNS.recognise(400, body, "api.studio.nebius.com") is not None
    assert PATTERNS.recognise(400, body, "localhost") is None  # the same shape elsewhere means list content is not taken


def test_the_source_keeps_a_short_message_to_the_end_of_its_verdict_without_keys() -> None:
    body = openai("Too many images in request. Max is 10. Your prompt was: SECRET PROMPT TEXT, key sk-proj-abcdefghijklmnopqrstuv")
    error = PATTERNS.recognise(400, body, "api.example.com")
    assert error is not None
    assert error.source == "400 openai-max-is: Too many images in request. Max is 10."
    keyed = parse_patterns('patterns:\n  - {name: k, status: [400], match: "limit \\\\d+ for \\\\S+", limit: image_count}')
    found = keyed.recognise(400, b"limit 3 for sk-proj-abcdefghijklmnop", "h")
    assert found is not None and "sk-proj" not in found.source and "[redacted]" in found.source


@pytest.mark.parametrize(
    "message",
    [
        "Too many images, max 10, for bob@example.com",
        "Too many images, max 10, request req_011CXyLbCw5kpB1NsykoTSqu",
        "Too many images, max 10, api_key=abc123",
        "Too many images, max 10, Bearer abc.def",
        "Too many images, max 10, key AIzaSyA1234567890abcdef",
    ],
)
def test_addresses_tokens_and_keys_are_taken_out_of_a_source(message: str) -> None:
    error = PATTERNS.recognise(400, openai(message), "h")
    assert error is not None and error.value == 10
    assert "[redacted]" in error.source
    assert not any(secret in error.source for secret in ("bob@", "req_011", "abc123", "abc.def", "AIza"))


def test_a_long_message_is_not_kept_and_a_catch_all_keeps_nothing_of_the_answer() -> None:
    long = "Too many images in request. Max is 10. " + "The rest of this message quotes the request at length. " * 3
    error = PATTERNS.recognise(400, openai(long), "h")
    assert error is not None and error.value == 10 and error.source == "400 openai-max-is"
    assert error_for(413, b"Failed to buffer the request body: length limit exceeded").source == "413 bare-413"
    html = b"<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body><center>nginx</center></body></html>"
    assert error_for(413, html).source == "413 bare-413"
    assert error_for(413, b"").source == "413 bare-413"


def test_an_answer_is_read_from_its_first_64_kib_only() -> None:
    body = b" " * (64 * 1024) + openai("Too many images in request. Max is 10.")
    assert PATTERNS.recognise(400, body, "h") is None


# --- tightening ---------------------------------------------------------------------------------------------


def error_for(status: int, body: bytes) -> LimitError:
    error = PATTERNS.recognise(status, body, "api.example.com")
    assert error is not None
    return error


def test_a_named_count_becomes_the_cap_and_bounds_keep_recent() -> None:
    error = error_for(400, openai("too many images: maximum allowed for model gemini-3.1-pro-preview is 10, got 11"))
    t = tightened(error, Limits(max_images=None, keep_recent=12), Refused(body_bytes=5_000_000, images=11))
    assert t is not None and dict(t.fields) == {"max_images": 10, "keep_recent": 10}
    assert t.describe(error) == "too many images (max 10, from the answer)"


def test_a_count_the_request_was_within_steps_down_from_what_was_sent() -> None:
    # "21 + 0 > 20" when only 12 images went (documents the text miscounts, a gateway's own counting): the cap goes under 12.
    error = error_for(400, openai("Too many images in request: 21 > 20"))
    t = tightened(error, Limits(max_images=16), Refused(body_bytes=1000, images=12))
    assert t is not None and dict(t.fields) == {"max_images": 10}
    assert not t.named


def test_a_bare_413_steps_down_to_the_common_limit_below_the_refused_size() -> None:
    error = error_for(413, b"")
    t = tightened(error, Limits(max_body_bytes=16 * 2**20), Refused(body_bytes=2_200_000, images=9))
    assert t is not None and dict(t.fields) == {"max_body_bytes": 2 * 2**20}
    assert t.describe(error) == "request too large (max 2,097,152 bytes, stepped down from what was refused)"
    # refused again just under 2 MiB: the next step is the decimal 2 MB
    assert step_down(BODY_BYTES, 2_097_000) == 2_000_000
    assert step_down(BODY_BYTES, 1_990_000) == 1_492_500  # no common limit near: three quarters


def test_steps_are_never_far_below_what_was_refused() -> None:
    for refused in (3_000, 70_000, 700_000, 3_000_000, 40_000_000, 900_000_000):
        step = step_down(BODY_BYTES, refused)
        assert step is not None and 0.75 * refused - 1 <= step < refused
    assert step_down(IMAGE_COUNT, 11) == 10
    assert step_down(IMAGE_COUNT, 9) == 8
    assert step_down(IMAGE_COUNT, 1) == 0  # one image refused for the count: a model that takes none
    assert step_down(IMAGE_COUNT, 0) is None


def test_nothing_to_tighten_when_the_limits_already_held_the_request_there() -> None:
    error = error_for(400, anthropic("messages.0.content.2.image.source.base64: image exceeds 5 MB maximum: 15908784 bytes > 5242880 bytes"))
    assert tightened(error, Limits(max_image_bytes=5 * 2**20), Refused(1, 1)) is None
    t = tightened(error, Limits(), Refused(1, 1))
    assert t is not None and dict(t.fields) == {"max_image_bytes": 5242880}
    count = error_for(400, openai("Too many images in request. Max is 10."))
    assert tightened(count, Limits(max_images=8), Refused(1, 9)) is None  # 9 went under a cap of 8: keep_recent held them


def test_the_many_image_rule_learns_its_threshold_too() -> None:
    error = error_for(
        400,
        anthropic(MANY_IMAGE_TEXT),
    )
    t = tightened(error, Limits(), Refused(1, 30))
    assert t is not None and dict(t.fields) == {"many_images_max_side": 2000, "many_images_threshold": 20}
    t = tightened(error, Limits(many_images_threshold=10, many_images_max_side=2500), Refused(1, 30))
    assert t is not None and dict(t.fields) == {"many_images_max_side": 2000, "many_images_threshold": 10}


# --- the patterns file ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("patterns:\n  - {name: a, status: [400], match: 'x (?P<limit>\\d+)', limit: images}", ":2: pattern 'a': limit must be one of image_count"),
        ("patterns:\n  - {name: a, status: [500], match: 'x', limit: image_count}", ":2: pattern 'a': status must be 4xx codes"),
        ("patterns:\n  - {name: a, status: [429], match: 'x', limit: image_count}", ":2: pattern 'a': 429 is never a limit error"),
        ("patterns:\n  - {name: a, status: [400], match: 'x (', limit: image_count}", ":2: pattern 'a': match is not a valid regular expression"),
        ("patterns:\n  - {name: a, status: [400], match: 'x', limit: image_side}", ":2: pattern 'a': a image_side limit cannot step down"),
        (
            "patterns:\n  - {name: a, status: [400], match: 'max (?P<limit>\\d+)', limit: image_count, example: 'max ten', expect: 10}",
            ":2: pattern 'a': match does not find its own example",
        ),
        (
            "patterns:\n  - {name: a, status: [400], match: 'max (?P<limit>\\d+)', limit: image_count, example: 'max 12', expect: 10}",
            ":2: pattern 'a': the example gives 12, not the expected 10",
        ),
        (
            "patterns:\n  - {name: a, status: [400], match: 'x', limit: image_count}\n  - {name: a, status: [400], match: 'y', limit: image_count}",
            ":3: duplicate pattern name 'a'",
        ),
        ("patterns:\n  - {name: a, status: [400], match: 'x', limit: image_count, max: 3}", ":2: unknown field 'max' in pattern 'a'"),
    ],
)
def test_a_bad_patterns_file_names_its_line(text: str, problem: str) -> None:
    with pytest.raises(RulesError, match=re.escape(problem)):
        parse_patterns(text, "mine.yaml")


def test_a_users_patterns_come_before_the_shipped_ones(tmp_path) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text("patterns:\n  - {name: my-gateway, status: [413], match: 'body over (?P<limit>\\d+)', limit: body_bytes}\n")
    patterns = load_patterns(mine)
    error = patterns.recognise(413, b"body over 500000 (my gateway)", "gw")
    assert error is not None and (error.pattern.name, error.value) == ("my-gateway", 500000)
    fallback = patterns.recognise(413, b"something else", "gw")
    assert fallback is not None and fallback.pattern.name == "bare-413"


# --- where the message is ----------------------------------------------------------------------------------------


def test_an_echoed_prompt_outside_the_message_is_never_a_verdict() -> None:
    # the limit's words sit in `param` and in a validation error's `input`, which echo the request
    assert PATTERNS.recognise(400, b'{"error":{"message":"Invalid image.","param":"Too many images in request. Max is 2."}}', "h") is None
    body = b'{"detail":[{"type":"value_error","loc":["body"],"msg":"bad","input":"too many images and documents: 5 + 0 > 2"}]}'
    assert PATTERNS.recognise(422, body, "h") is None


# --- the general reader, after the named patterns ----------------------------------------------------------


def test_the_general_reader_runs_after_the_named_patterns_and_before_the_catch_alls() -> None:
    # a 413 naming one image's limit is that limit, not a body limit stepped down
    error = PATTERNS.recognise(413, b'{"error":{"message":"Downloaded image content cannot exceed 30MB","code":413}}', "openrouter.ai")
    assert error is not None and (error.pattern.name, error.kind, error.value) == ("general", IMAGE_BYTES, 30_000_000)
    assert scope(error) == "model"
    # a named pattern wins where both read the answer
    named = PATTERNS.recognise(400, openai("Too many images in request: 11 > 8"), "h")
    assert named is not None and named.pattern.name == "gateway-count-over"
    # what the general reader cannot read falls to the catch-all
    bare = PATTERNS.recognise(413, openai("Payload Too Large"), "h")
    assert bare is not None and bare.pattern.name == "bare-413"
    # a body limit it reads holds for the whole host, as the named ones do
    body = PATTERNS.recognise(400, openai("request body limit: 4 MB"), "h")
    assert body is not None and scope(body) == "host"


@pytest.mark.parametrize("status", [400, 422])
def test_a_400_or_422_that_names_what_was_too_large_but_no_number_steps_down_as_a_bare_413_does(status: int) -> None:
    body = error_for(status, openai("Request payload is too large"))
    assert (body.pattern.name, body.kind, body.value) == ("general", BODY_BYTES, None)
    t = tightened(body, Limits(), Refused(body_bytes=2_200_000, images=9))
    assert t is not None and dict(t.fields) == {"max_body_bytes": 2 * 2**20} and not t.named
    count = error_for(status, openai("Too many images in this conversation"))
    t = tightened(count, Limits(), Refused(body_bytes=1000, images=22))
    assert count.kind == IMAGE_COUNT and t is not None and dict(t.fields) == {"max_images": 20}


def test_a_413_that_names_no_number_is_the_catch_alls_which_steps_the_body_down() -> None:
    # the general reader would read one image's side here, which has no figure to step down from; the body has
    error = error_for(413, openai("Image exceeds max pixels allowed."))
    assert error.pattern.name == "bare-413" and error.kind == BODY_BYTES
    named = error_for(413, openai("Downloaded image content cannot exceed 30MB"))  # a number: the general reader's
    assert (named.pattern.name, named.kind) == ("general", IMAGE_BYTES)


@pytest.mark.parametrize(
    ("limits", "refused", "fields"),
    [
        (Limits(max_image_side=4096), Refused(1000, 1), {"max_image_side": 3840}),  # under the limit that applied
        (Limits(), Refused(1000, 1, largest_image_side=5000), {"max_image_side": 4096}),  # under the largest image sent
        (Limits(max_image_side=4096), Refused(1000, 1, largest_image_side=3000), {"max_image_side": 2560}),  # the lower
    ],
)
def test_one_images_side_named_without_a_number_steps_down_from_what_is_known(limits: Limits, refused: Refused, fields: dict[str, int]) -> None:
    error = error_for(400, b'{"message":"400 Bad Request: Image exceeds max pixels allowed."}')
    assert (error.kind, error.value) == (IMAGE_SIDE, None)
    t = tightened(error, limits, refused)
    assert t is not None and dict(t.fields) == fields and not t.named


def test_one_images_bytes_named_without_a_number_step_down_or_say_why_not() -> None:
    error = error_for(400, openai("The uploaded file is too large."))
    assert (error.kind, error.value) == (IMAGE_BYTES, None)
    t = tightened(error, Limits(max_image_bytes=5 * 2**20), Refused(1000, 1))
    assert t is not None and dict(t.fields) == {"max_image_bytes": 5_000_000}
    assert why_not(error, Limits(), Refused(1000, 1)) == "image too large: the answer names no number, and no image size is known to step down from"


def test_an_answer_about_a_rate_per_minute_is_no_limit() -> None:
    assert PATTERNS.recognise(400, openai("Too many images per minute: max 50"), "h") is None
    assert PATTERNS.recognise(400, openai("IPM limit reached: at most 20 images"), "h") is None


@pytest.mark.parametrize("status", [401, 403, 404, 407, 408, 429, 500, 502, 503])
def test_the_general_reader_never_reads_other_statuses(status: int) -> None:
    assert PATTERNS.recognise(status, openai("too many URL images in request (max 20)"), "h") is None


def test_an_answer_about_tokens_is_no_limit_even_as_a_413() -> None:
    groq = openai("Request too large for model `llama-3.3-70b-versatile` on tokens per minute (TPM): Limit 6000, Requested 10338")
    assert PATTERNS.recognise(413, groq, "api.groq.com") is None
    assert PATTERNS.recognise(413, anthropic("Prompt is too long"), "h") is None


def test_a_user_pattern_file_is_checked_against_its_own_example_only() -> None:
    # the general reader would read this example; the pattern itself must, or the file is refused
    with pytest.raises(RulesError, match="match does not find its own example"):
        parse_patterns("patterns:\n  - {name: a, status: [400], match: 'nothing like it', limit: image_count, example: 'max 20 images'}")


# --- what a refusal may teach ------------------------------------------------------------------------------------


def general_error(message: str, status: int = 400) -> LimitError:
    error = PATTERNS.recognise(status, openai(message), "h")
    assert error is not None
    return error


@pytest.mark.parametrize(
    ("message", "refused", "why"),
    [
        ("Too many images in request. Max is 0.", Refused(1000, 3), "too many images: 0 is under the floor of 1"),
        ("images per request: at most 0", Refused(1000, 3), "too many images: 0 is under the floor of 1"),
        ("request body cannot exceed 0 bytes", Refused(200_000, 3), "request too large: 0 bytes is under the floor of 65,536 bytes"),
        ("Max 50KB", Refused(200_000, 3), "request too large: 50,000 bytes is under the floor of 65,536 bytes"),
        ("image must be at most 8 KiB", Refused(200_000, 3), "image too large: 8,192 bytes is under the floor of 65,536 bytes"),
        ("image side must be at most 40px", Refused(200_000, 3), "image too wide: 40px is under the floor of 256px"),
    ],
)
def test_a_figure_under_a_floor_teaches_nothing_and_says_why(message: str, refused: Refused, why: str) -> None:
    error = general_error(message) if "Max is 0." not in message else error_for(400, openai(message))
    assert tightened(error, Limits(), refused) is None
    assert why_not(error, Limits(), refused) == why


def test_the_floors_hold_for_stepped_down_figures_too() -> None:
    count = error_for(400, openai("HTTP 400 \u2013 Max images exceeded"))
    assert tightened(count, Limits(), Refused(1000, 1)) is None  # one image refused: the next step is none at all
    assert why_not(count, Limits(), Refused(1000, 1)) == "too many images: 0 is under the floor of 1"
    body = error_for(413, b"")
    assert tightened(body, Limits(), Refused(60_000, 1)) is None  # no common limit under it, and 3/4 of it is under 64 KiB
    t = tightened(body, Limits(), Refused(70_000, 1))
    assert t is not None and dict(t.fields) == {"max_body_bytes": 65_536}


def test_keep_recent_follows_the_cap_down_but_never_under_one() -> None:
    t = tightened(general_error("at most 1 image(s) may be sent"), Limits(keep_recent=3), Refused(1000, 4))
    assert t is not None and dict(t.fields) == {"max_images": 1, "keep_recent": 1}


@pytest.mark.parametrize(
    ("message", "refused", "applied"),
    [
        ("image must be at most 5 MB", Refused(9_000_000, 2, largest_image_bytes=6_000_000), True),
        ("image must be at most 5 MB", Refused(9_000_000, 2, largest_image_bytes=4_000_000), False),  # it was within: a misread
        ("image must be at most 5 MB", Refused(9_000_000, 2), True),  # the largest image unknown: the figure is taken
        ("image side must be at most 2000px", Refused(9_000_000, 2, largest_image_side=2560), True),
        ("image side must be at most 2000px", Refused(9_000_000, 2, largest_image_side=1920), False),
    ],
)
def test_a_per_image_figure_counts_only_below_the_largest_image_sent(message: str, refused: Refused, applied: bool) -> None:
    error = general_error(message)
    t = tightened(error, Limits(), refused)
    assert (t is not None) == applied
    if not applied:
        reason = why_not(error, Limits(), refused)
        assert reason is not None and "no lower than the largest image sent" in reason


def test_why_not_names_the_limits_that_held_and_says_nothing_when_fields_are_given() -> None:
    error = error_for(400, anthropic("messages.0.content.2.image.source.base64: image exceeds 5 MB maximum: 15908784 bytes > 5242880 bytes"))
    assert why_not(error, Limits(max_image_bytes=5 * 2**20), Refused(1, 1)) == (
        "image too large: the limits that applied (5,242,880 bytes) already held the request there"
    )
    assert why_not(error, Limits(), Refused(1, 1)) is None
    assert isinstance(assess(error, Limits(), Refused(1, 1)), Tightening)
    assert isinstance(assess(error, Limits(max_image_bytes=1 << 20), Refused(1, 1)), Rejected)


def test_every_reason_is_one_line_without_the_answers_text() -> None:
    secret = "SECRET-PROMPT"
    error = general_error(f"request body cannot exceed 0 bytes ({secret})")
    reason = why_not(error, Limits(), Refused(200_000, 3))
    assert reason is not None and "\n" not in reason and secret not in reason


def test_what_read_an_answer_is_named_in_its_error() -> None:
    general = PATTERNS.recognise(400, openai("a request carries at most 20 images."), "h")
    assert general is not None and general.pattern.name == "general" and not general.pattern.catch_all
    assert general.source == "400 general: a request carries at most 20 images."
    bare = PATTERNS.recognise(413, b"", "h")
    assert bare is not None and bare.pattern.catch_all
