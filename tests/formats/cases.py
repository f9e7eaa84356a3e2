"""Realistic request bodies for each wire format, shared by the format tests, with the media each holds in document order."""

from __future__ import annotations

from trimflow.testing import b64, data_url, image

PNG = image(64, 48, "PNG", seed=1)
JPEG = image(80, 60, "JPEG", seed=2)
PDF = b"%PDF-1.7\n" + b"0" * 64

# For each format: a realistic body mixing text, images in every place the format allows,
# remote media, documents and malformed entries; and the (kind, path) of each media in order.
CASES = {
    "openai-chat": (
        {
            "model": "gpt-4o",
            "messages": [
                {"role": "system", "content": "be brief"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "look"},
                        {"type": "image_url", "image_url": {"url": data_url(PNG, "image/png"), "detail": "high"}},
                    ],
                },
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "shot", "arguments": "{}"}}],
                },
                {"role": "tool", "tool_call_id": "c1", "content": [{"type": "image_url", "image_url": {"url": data_url(JPEG, "image/jpeg")}}]},
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "https://example.invalid/a.png"}},
                        {"type": "file", "file": {"filename": "a.pdf", "file_data": data_url(PDF, "application/pdf")}},
                        {"type": "input_audio", "input_audio": {"data": b64(b"RIFF0000"), "format": "wav"}},
                        "not a part",
                        7,
                        None,
                        {"type": "image_url"},
                        {"type": "image_url", "image_url": "data:image/png;base64," + b64(PNG)},
                    ],
                },
            ],
            "temperature": 0.25,
            "x_unknown": {"kept": [1, 2.5, "é"]},
        },
        [
            ("image", ("messages", 1, "content", 1)),
            ("image", ("messages", 3, "content", 0)),
            ("image", ("messages", 4, "content", 0)),
            ("document", ("messages", 4, "content", 1)),
            ("audio", ("messages", 4, "content", 2)),
            ("image", ("messages", 4, "content", 7)),
        ],
    ),
    "openai-responses": (
        {
            "model": "gpt-4.1",
            "instructions": "be brief",
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "look"},
                        {"type": "input_image", "image_url": data_url(PNG, "image/png"), "detail": "low"},
                    ],
                },
                {"type": "function_call", "call_id": "c1", "name": "shot", "arguments": "{}"},
                {
                    "type": "function_call_output",
                    "call_id": "c1",
                    "output": [
                        {"type": "input_text", "text": "screen:"},
                        {"type": "input_image", "image_url": data_url(JPEG, "image/jpeg")},
                    ],
                },
                {"type": "function_call_output", "call_id": "c2", "output": "plain text output"},
                {
                    "role": "user",
                    "content": [
                        {"type": "input_image", "file_id": "file-abc"},
                        {"type": "input_file", "filename": "a.pdf", "file_data": data_url(PDF, "application/pdf")},
                        42,
                    ],
                },
                "garbage item",
                {"type": "computer_call", "call_id": "c3", "action": {"type": "click", "x": 10, "y": 20}, "pending_safety_checks": []},
                {
                    "type": "computer_call_output",
                    "call_id": "c3",
                    "output": {"type": "computer_screenshot", "image_url": data_url(PNG, "image/png"), "detail": "high"},
                },
                {"type": "computer_call_output", "call_id": "c4", "output": {"type": "computer_screenshot", "file_id": "file-shot"}},
                {"type": "computer_call_output", "call_id": "c5", "output": "not a screenshot"},
            ],
            "store": False,
        },
        [
            ("image", ("input", 0, "content", 1)),
            ("image", ("input", 2, "output", 1)),
            ("image", ("input", 4, "content", 0)),
            ("document", ("input", 4, "content", 1)),
            ("image", ("input", 7, "output")),
            ("image", ("input", 8, "output")),
        ],
    ),
    "anthropic": (
        {
            "model": "claude-sonnet-4-5",
            "max_tokens": 100,
            "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)},
                            "cache_control": {"type": "ephemeral"},
                        },
                        {"type": "text", "text": "look"},
                    ],
                },
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "computer", "input": {"action": "screenshot"}}]},
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [
                                {"type": "text", "text": "done"},
                                {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": b64(JPEG)}},
                            ],
                        },
                        {"type": "tool_result", "tool_use_id": "t0", "content": "string result"},
                        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": b64(PDF)}},
                        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "plain"}},
                        {"type": "image", "source": {"type": "url", "url": "https://example.invalid/x.png"}},
                        {"type": "image", "source": "broken"},
                    ],
                },
                {"role": "user", "content": "plain string content"},
            ],
        },
        [
            ("image", ("messages", 0, "content", 0)),
            ("image", ("messages", 2, "content", 0, "content", 1)),
            ("document", ("messages", 2, "content", 2)),
            ("image", ("messages", 2, "content", 4)),
        ],
    ),
    "gemini": (
        {
            "systemInstruction": {"parts": [{"text": "be brief"}]},
            "contents": [
                {"role": "user", "parts": [{"text": "look"}, {"inline_data": {"mime_type": "image/png", "data": b64(PNG)}}]},
                {"role": "model", "parts": [{"functionCall": {"name": "shot", "args": {}}}]},
                {
                    "role": "user",
                    "parts": [
                        {
                            "functionResponse": {
                                "name": "shot",
                                "response": {"ok": True},
                                "parts": [
                                    {"inlineData": {"mimeType": "image/jpeg", "data": b64(JPEG)}},
                                ],
                            }
                        },
                        {"inlineData": {"mimeType": "application/pdf", "data": b64(PDF)}},
                        {"fileData": {"mimeType": "image/png", "fileUri": "gs://bucket/x.png"}},
                        {"file_data": {"mime_type": "video/mp4", "file_uri": "https://example.invalid/v.mp4"}},
                    ],
                },
            ],
            "generationConfig": {"temperature": 0.1},
        },
        [
            ("image", ("contents", 0, "parts", 1)),
            ("image", ("contents", 2, "parts", 0, "functionResponse", "parts", 0)),
            ("document", ("contents", 2, "parts", 1)),
            ("image", ("contents", 2, "parts", 2)),
            ("video", ("contents", 2, "parts", 3)),
        ],
    ),
    "bedrock-converse": (
        {
            "system": [{"text": "be brief"}],
            "messages": [
                {"role": "user", "content": [{"text": "look"}, {"image": {"format": "png", "source": {"bytes": b64(PNG)}}}]},
                {"role": "assistant", "content": [{"toolUse": {"toolUseId": "t1", "name": "shot", "input": {}}}]},
                {
                    "role": "user",
                    "content": [
                        {
                            "toolResult": {
                                "toolUseId": "t1",
                                "content": [{"image": {"format": "jpeg", "source": {"bytes": b64(JPEG)}}}, {"text": "ok"}],
                            }
                        },
                        {"document": {"format": "pdf", "name": "a", "source": {"bytes": b64(PDF)}}},
                        {"image": {"format": "png", "source": {"s3Location": {"uri": "s3://b/x.png"}}}},
                    ],
                },
            ],
        },
        [
            ("image", ("messages", 0, "content", 1)),
            ("image", ("messages", 2, "content", 0, "toolResult", "content", 0)),
            ("document", ("messages", 2, "content", 1)),
            ("image", ("messages", 2, "content", 2)),
        ],
    ),
    "ollama": (
        {
            "model": "llava",
            "messages": [
                {"role": "user", "content": "look", "images": [b64(PNG), b64(JPEG)]},
                {"role": "assistant", "content": "a chart"},
                {"role": "user", "content": "", "images": [b64(PNG), 5]},
            ],
            "options": {"num_ctx": 8192},
        },
        [
            ("image", ("messages", 0, "images", 0)),
            ("image", ("messages", 0, "images", 1)),
            ("image", ("messages", 2, "images", 0)),
        ],
    ),
}

# Where each medium of CASES came from (trimflow._media: user, tool, agent), in the same order.
ORIGINS = {
    "openai-chat": ["user", "tool", "user", "user", "user", "user"],
    "openai-responses": ["user", "tool", "user", "user", "tool", "tool"],
    "anthropic": ["user", "tool", "agent", "agent"],
    "gemini": ["user", "tool", "agent", "agent", "agent"],
    "bedrock-converse": ["user", "tool", "agent", "agent"],
    "ollama": ["user", "user", "user"],
}


def _chat_image() -> dict[str, object]:
    return {"type": "image_url", "image_url": {"url": data_url(PNG, "image/png")}}


def _responses_image() -> dict[str, object]:
    return {"type": "input_image", "image_url": data_url(PNG, "image/png")}


def _gemini_image() -> dict[str, object]:
    return {"inline_data": {"mime_type": "image/png", "data": b64(PNG)}}


# The screenshot an agent sends as a user message right after a tool call, in the formats whose tool results take
# no image there (or not always): a message of nothing but images after the tool's is the agent's; one with text of
# its own, or one after anything else, is the user's. A placeholder trimflow wrote is not the message's own text.
AFTER_TOOL_CASES = {
    "openai-chat": (
        {
            "model": "gpt-4o",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "build this page"}, _chat_image()]},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "shot"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "done"},
                {"role": "user", "content": [_chat_image()]},
                {"role": "user", "content": [{"type": "text", "text": "[trimflow: image #3 omitted (image/png, 64x48, 1KB)]"}, _chat_image()]},
                {"role": "assistant", "content": [_chat_image()]},
                {"role": "user", "content": [_chat_image()]},
                {"role": "tool", "tool_call_id": "c2", "content": [_chat_image()]},
                {"role": "user", "content": [{"type": "text", "text": "and now this"}, _chat_image()]},
            ],
        },
        ["user", "agent", "agent", "agent", "user", "tool", "user"],
    ),
    "openai-responses": (
        {
            "model": "gpt-5",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "build this page"}, _responses_image()]},
                {"type": "function_call", "call_id": "c1", "name": "shot", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "done"},
                {"type": "message", "role": "user", "content": [_responses_image()]},
                {"type": "message", "role": "assistant", "content": [_responses_image()]},
                {"role": "user", "content": [_responses_image()]},
                {"type": "function_call_output", "call_id": "c2", "output": "done"},
                {"role": "user", "content": [{"type": "input_text", "text": "and now this"}, _responses_image()]},
            ],
        },
        ["user", "agent", "agent", "user", "user"],
    ),
    "gemini": (
        {
            "contents": [
                {"role": "user", "parts": [{"text": "build this page"}, _gemini_image()]},
                {"role": "model", "parts": [{"functionCall": {"name": "shot", "args": {}}}]},
                {"role": "user", "parts": [{"functionResponse": {"name": "shot", "response": {"ok": True}}}]},
                {"role": "user", "parts": [_gemini_image()]},
                {"role": "function", "parts": [_gemini_image()]},
                {"role": "user", "parts": [{"text": "and now this"}, _gemini_image()]},
            ],
        },
        ["user", "agent", "tool", "user"],
    ),
    "ollama": (
        {
            "model": "llava",
            "messages": [
                {"role": "user", "content": "build this page", "images": [b64(PNG)]},
                {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "shot", "arguments": {}}}]},
                {"role": "tool", "content": "done", "images": [b64(PNG)]},
                {"role": "user", "content": "", "images": [b64(PNG)]},
                {"role": "user", "content": "[trimflow: image #4 omitted (image/png, 64x48, 1KB)]", "images": [b64(PNG)]},
                {"role": "user", "content": "and now this", "images": [b64(PNG)]},
            ],
        },
        ["user", "tool", "agent", "agent", "user"],
    ),
}
