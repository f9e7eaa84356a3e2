"""Where the provider's message is (trimflow._answer_messages): only its own error message is read, never a string
the answer echoes from the request."""

from __future__ import annotations

import orjson
import pytest

from trimflow._answer_messages import answer_messages


@pytest.mark.parametrize(
    ("body", "messages"),
    [
        (b'{"error":{"message":"too many images","type":"invalid_request_error","param":null,"code":null}}', ["too many images"]),
        (b'{"message":"m","param":"screenshot_0.png","input":"max 5 images"}', ["m"]),
        (b'{"error":"Failed to read request body: length limit exceeded"}', ["Failed to read request body: length limit exceeded"]),
        (b'{"detail":"Payload too large"}', ["Payload too large"]),
        (
            b'{"detail":[{"type":"string_type","loc":["body","messages",3,"content","str"],"msg":"Input should be a valid string",'
            b'"input":"quoted"}]}',
            ["body.messages.3.content.str: Input should be a valid string (string_type)"],
        ),
        (b'{"errors":[{"message":"first"},{"message":"second"}]}', ["first", "second"]),
        (b'{"errors":{"message":"one","request_id":"x"}}', ["one"]),
        (b'[{"error":{"code":400,"message":"streamed","status":"INVALID_ARGUMENT"}}]', ["streamed"]),
        (
            b'{"error":{"message":"Provider returned error","code":400,'
            b'"metadata":{"raw":"{\\"error\\":{\\"message\\":\\"inner\\",\\"param\\":\\"input\\"}}"}}}',
            ["Provider returned error", "inner"],
        ),
        (
            orjson.dumps({"error": {"message": 'litellm.BadRequestError: OpenAIException - {"object":"error","message":"inner"}'}}),
            ["litellm.BadRequestError: OpenAIException", "inner"],
        ),
        (b'{"message":"The model returned the following errors: image too big"}', ["image too big"]),
        (b"<html><head><title>413 Request Entity Too Large</title></head><body><p>quoted prompt</p></body></html>", ["413 Request Entity Too Large"]),
        (b"<html><body><center><h1>413 Payload Too Large</h1></center></body></html>", ["413 Payload Too Large"]),
        (b"  Failed to buffer the request body:\n length limit exceeded\n", ["Failed to buffer the request body: length limit exceeded"]),
        (b'{"error": {"message": "cut', []),  # JSON that does not parse: nothing is read rather than everything
        (b'{"id":"ok","choices":[]}', []),
    ],
)
def test_only_the_providers_message_is_read(body: bytes, messages: list[str]) -> None:
    assert answer_messages(body) == messages
