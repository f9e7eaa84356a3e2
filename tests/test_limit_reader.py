"""The general reader (trimflow._limit_reader): the kinds of sentence that state a limit, with their number or
without one, and the numbers that are no limit."""

from __future__ import annotations

import orjson
import pytest

from trimflow._limit_errors import load_patterns
from trimflow._limit_reader import BODY_BYTES, IMAGE_BYTES, IMAGE_COUNT, IMAGE_SIDE, read_limit


def openai(message: str) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}})


# --- the general reader's grammar --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "kind", "value"),
    [
        # cues before the number, with the words they may take
        ("too many URL images in request (max 20)", IMAGE_COUNT, 20),
        ("Exceeded maximum number of images (50) allowed in the request.", IMAGE_COUNT, 50),
        ("a request carries at most 20 images.", IMAGE_COUNT, 20),
        ("Images per request: up to 8", IMAGE_COUNT, 8),
        ("Please make sure your payload is below 26214400 bytes in size.", BODY_BYTES, 26_214_400),
        ("Downloaded image content cannot exceed 30MB", IMAGE_BYTES, 30_000_000),
        ("The maximum request size is 32 MB", BODY_BYTES, 32_000_000),
        ("Maximum request body size 1048576 exceeded, actual body size 1056562", BODY_BYTES, 1_048_576),
        ("Max 50KB", BODY_BYTES, 50_000),
        # a cue after the number
        ("image is over the 20 MiB limit", IMAGE_BYTES, 20 * 2**20),
        ("payload exceeds 10 MB maximum", BODY_BYTES, 10_000_000),
        # a comparison: the right side is the limit, the left what was sent
        ("response.create is too large for upstream websocket (18915698 bytes > 15728640 bytes)", BODY_BYTES, 15_728_640),
        ("Too many images in request: 11 > 8", IMAGE_COUNT, 8),
        # the count's words may be a sentence before the number's
        ("Too many images in request. Max is 10.", IMAGE_COUNT, 10),
        # units as written: decimal and binary, separators, a space or none
        ("image must be at most 5,242,880 bytes", IMAGE_BYTES, 5_242_880),
        ("image must be at most 5 MB", IMAGE_BYTES, 5_000_000),
        ("image must be at most 5MB", IMAGE_BYTES, 5_000_000),
        ("image must be at most 5MiB", IMAGE_BYTES, 5 * 2**20),
        ("request body limit: 1.5 GB", BODY_BYTES, 1_500_000_000),
        ("request body limit: 512 KiB", BODY_BYTES, 512 * 1024),
        # sides, dimensions and areas
        ("At least one of the image dimensions exceed max allowed size: 8000 pixels", IMAGE_SIDE, 8000),
        ("image side must be at most 1568px", IMAGE_SIDE, 1568),
        ("input size exceed limit 2048x2048,current input:(1080,2376)", IMAGE_SIDE, 2048),
        ("Current dimensions: 4634x12324 = 57109416 pixels. Maximum allowed: 36000000 pixels.", IMAGE_SIDE, 6000),
        ("image exceeds the limit of 4 megapixels", IMAGE_SIDE, 2000),
        # the file or image a size belongs to, however it is named
        ("The file size of `gs://b/image.png` is 47688287, which exceeds max allowed file size of 31457280", IMAGE_BYTES, 31_457_280),
        ("media exceeds size limit: max 10485760 bytes", IMAGE_BYTES, 10_485_760),
        ("The image is too large. Maximum size is 20 MB.", IMAGE_BYTES, 20_000_000),  # the kind named a sentence before
        ("Request rejected. Maximum size is 20 MB.", BODY_BYTES, 20_000_000),
        ("Payload Too Large: max 50KB", BODY_BYTES, 50_000),
        ("File size exceeds the 20MB limit", IMAGE_BYTES, 20_000_000),
        # more wordings of a count and a side
        ("Maximum number of images per request is 10", IMAGE_COUNT, 10),
        ("You can upload up to 4 images", IMAGE_COUNT, 4),
        ("Only 1 image is supported per request", IMAGE_COUNT, 1),
        ("Number of images (25) exceeds the limit (20)", IMAGE_COUNT, 20),
        ("too many images (12), max is 10", IMAGE_COUNT, 10),
        ("image dimensions must not exceed 4096x4096", IMAGE_SIDE, 4096),
    ],
)
def test_the_general_reader_reads_the_number_and_what_it_limits(message: str, kind: str, value: int) -> None:
    reading = read_limit(message)
    assert reading is not None and (reading.kind, reading.value) == (kind, value)
    error = load_patterns().recognise(422, openai(message), "h")  # 422 is read like 400 and 413
    assert error is not None and (error.kind, error.value) == (kind, value)


@pytest.mark.parametrize(
    "message",
    [
        "Too many images in request. Max is 0.png",  # a file name, not a number
        "model gpt-4o does not support images",  # a number inside a name
        "messages.19.content.27.image.source.base64.data: Invalid base64",  # numbers inside a path
        "request contains 52 images",  # what was sent, no limit
        "Image count 5 exceeds the model's",  # what was sent, left of "exceeds"
        "The image length and width do not meet the model restrictions. [height:1 or width:1 must be larger than 10]",  # a minimum
        "Prompt length of 16601 is longer than the maximum model length 10000.",  # a length with no unit: not bytes, not images
        "The decoder prompt contains a(n) image item with length 6132, which exceeds the pre-allocated encoder cache size 6084.",
        "request (4390 tokens) exceeds the available context size (4096 tokens)",  # tokens
        "max 5 retries allowed",  # a count of something else
        "The image you provided requires 33174 patches after processing, exceeding the limit of 30000.",  # patches of one image
        "413 Request Entity Too Large",  # a status and its reason phrase: a page's title, no verdict of its own
    ],
)
def test_the_general_reader_leaves_what_names_no_limit(message: str) -> None:
    assert read_limit(message) is None


def test_a_message_is_read_for_its_first_32_numbers_only() -> None:
    # a hostile answer full of numbers costs a bounded amount of reading: what comes after them is not read
    assert read_limit("request body: " + ", ".join(str(n) for n in range(31)) + "; max 5 MB") is not None
    assert read_limit("request body: " + ", ".join(str(n) for n in range(40)) + "; max 5 MB") is None


# --- the kinds of sentence ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "kind", "value"),
    [
        # the limit's noun phrase, then a colon, a dash or a parenthesis, then the number
        ("max images: 5", IMAGE_COUNT, 5),
        ("Maximum images per request - 16", IMAGE_COUNT, 16),
        ("image attachments (max 8)", IMAGE_COUNT, 8),
        ("max_images=8 exceeded", IMAGE_COUNT, 8),
        ("max image size: 5MB", IMAGE_BYTES, 5_000_000),
        ("request body limit - 2 MiB", BODY_BYTES, 2 * 2**20),
        # the number first, the limit after it
        ("20 images is the maximum per request", IMAGE_COUNT, 20),
        ("20 is the maximum number of images", IMAGE_COUNT, 20),
        ("8000 pixels max", IMAGE_SIDE, 8000),
        # a comparison sign after the limit's noun: what is counted is over the number
        ("too many images: image_count > 20", IMAGE_COUNT, 20),
        ("images > 20", IMAGE_COUNT, 20),
        ("request body must be <= 10485760 bytes", BODY_BYTES, 10_485_760),
        ("image count must be \u2264 32", IMAGE_COUNT, 32),
        ("number of images < 17", IMAGE_COUNT, 16),
        # relations in words
        ("Please use fewer than 100 images per request", IMAGE_COUNT, 99),
        ("send less than 11 pictures", IMAGE_COUNT, 10),
        ("no more than 4 images may be sent", IMAGE_COUNT, 4),
        ("You can attach up to 30 images", IMAGE_COUNT, 30),
        ("the number of images exceeds 50", IMAGE_COUNT, 50),
        ("a request cannot carry more than 12 images", IMAGE_COUNT, 12),
        ("image is over 10 MB", IMAGE_BYTES, 10_000_000),
        ("payload size must be less than 4 MB", BODY_BYTES, 4_000_000),  # a size keeps its number: one byte is nothing
        ("Number of image files exceeds the maximum limit 9", IMAGE_COUNT, 9),
        ("Image too large. Please limit to 50 megapixels.", IMAGE_SIDE, 7071),
        ("Image size (12.5MB) exceeds your current limit of 10MB.", IMAGE_BYTES, 10_000_000),
        # what was sent, then the limit, in either order
        ("images: 21 (max 20)", IMAGE_COUNT, 20),
        ("maximum 20 images, got 21", IMAGE_COUNT, 20),
        ("got 21 images, maximum is 20", IMAGE_COUNT, 20),
    ],
)
def test_each_kind_of_sentence_is_read_whatever_its_order(message: str, kind: str, value: int) -> None:
    reading = read_limit(message)
    assert reading is not None and (reading.kind, reading.value) == (kind, value)


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("Request exceeds the maximum size", BODY_BYTES),
        ("Request Entity Too Large", BODY_BYTES),
        ("Request payload is too large", BODY_BYTES),
        ("Failed to buffer the request body: length limit exceeded", BODY_BYTES),
        ("The uploaded file is too large.", IMAGE_BYTES),
        ("image too big", IMAGE_BYTES),
        ("The request's attached files are too large to be read", IMAGE_BYTES),  # the files, not the request
        ("Image exceeds max pixels allowed.", IMAGE_SIDE),
        ("400 Bad Request: image dimensions exceed the limit", IMAGE_SIDE),  # the status is no number of the limit
        ("Too many images in this conversation", IMAGE_COUNT),
        ("Max images exceeded", IMAGE_COUNT),
    ],
)
def test_a_sentence_that_names_no_number_names_what_was_too_large(message: str, kind: str) -> None:
    reading = read_limit(message)
    assert reading is not None and (reading.kind, reading.value) == (kind, None)


@pytest.mark.parametrize(
    "message",
    [
        "LLM request body must be valid JSON",  # the body, but no too-large cue
        "Argument not supported: size",
        "Input is too long for requested model.",  # "input" alone is no size: Bedrock says it of tokens
        "Request timeout exceeded",  # the request, but nothing of its size
        "Image does not match the provided media type image/png",
        "upstream request failed",
        "Too many images in request. Max is 0.png",  # a limit the reader cannot read: no step down either
        "The decoder prompt contains a(n) image item with length 6132, which exceeds the cache.",  # numbers it cannot read
        "Unable to submit request because it has 20 video files but the model only supports up to 10.",  # videos
        "Model do not support image input. Request id: 021788846573420402c3547e09b7409e300241a04980e228ce7ce",
        "bad response status code 400 (request id: 202504261359457844612247PuUB3j0)",
        "illegal base64 data at input byte 5",
        "Please retry after 20 seconds",
        "Invalid value at 2025-04-26T13:59:45Z for images",
        "model claude-3.5-sonnet-20241022 v1.2.3 does not support 4 images yet",
        "image width must be > 10",  # a minimum
        "image width must be larger than 10 pixels",
        "retries: 3 max",
    ],
)
def test_what_is_no_limit_stays_unread(message: str) -> None:
    assert read_limit(message) is None
