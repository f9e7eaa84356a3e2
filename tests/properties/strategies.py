"""What the property and fuzz tests draw from: real images, any text, the count limits, and a conversation
rendered in each wire format."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from trimflow.testing import b64, data_url, image

# A pool of distinct real images, so the newest kept can be told apart from the rest.
POOL = [image(8 + i, 8, "PNG", seed=i) for i in range(12)]

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)
limits = st.fixed_dictionaries(
    {
        "max_images": st.one_of(st.none(), st.integers(0, 6)),
        "keep_recent": st.integers(0, 3),
        "prune_batch": st.integers(1, 4),
    }
)


def render(fmt: str, conv: list, extra: dict, pool: list[bytes] = POOL) -> dict[str, Any]:
    """The conversation in one wire format, tool results nested where the format has them; image i is pool[i]."""
    if fmt == "openai-chat":
        msgs = [
            {
                "role": role,
                "content": [
                    {"type": "text", "text": v} if k == "text" else {"type": "image_url", "image_url": {"url": data_url(pool[v], "image/png")}}
                    for k, v in parts
                ],
            }
            for role, _tool, parts in conv
        ]
        return {"model": "gpt-4o", "messages": msgs, **extra}
    if fmt == "openai-responses":
        items = []
        for i, (role, tool, parts) in enumerate(conv):
            content = [
                {"type": "input_text", "text": v} if k == "text" else {"type": "input_image", "image_url": data_url(pool[v], "image/png")}
                for k, v in parts
            ]
            items.append({"type": "function_call_output", "call_id": f"c{i}", "output": content} if tool else {"role": role, "content": content})
        return {"model": "gpt-4.1", "input": items, **extra}
    if fmt == "anthropic":
        msgs = []
        for i, (role, tool, parts) in enumerate(conv):
            blocks = [
                {"type": "text", "text": v}
                if k == "text"
                else {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(pool[v])}}
                for k, v in parts
            ]
            msgs.append({"role": role, "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": blocks}] if tool else blocks})
        return {"model": "claude-x", "max_tokens": 10, "messages": msgs, **extra}
    if fmt == "gemini":
        contents = []
        for role, tool, parts in conv:
            ps = [{"text": v} if k == "text" else {"inlineData": {"mimeType": "image/png", "data": b64(pool[v])}} for k, v in parts]
            parts_or_tool = [{"functionResponse": {"name": "f", "response": {}, "parts": ps}}] if tool else ps
            contents.append({"role": "user" if role == "user" else "model", "parts": parts_or_tool})
        return {"contents": contents, **extra}
    if fmt == "bedrock-converse":
        msgs = []
        for i, (role, tool, parts) in enumerate(conv):
            blocks = [{"text": v} if k == "text" else {"image": {"format": "png", "source": {"bytes": b64(pool[v])}}} for k, v in parts]
            msgs.append({"role": role, "content": [{"toolResult": {"toolUseId": f"t{i}", "content": blocks}}] if tool else blocks})
        return {"messages": msgs, **extra}
    msgs = []
    for role, _tool, parts in conv:
        texts = [v for k, v in parts if k == "text"]
        msg = {"role": role, "content": " ".join(texts)}
        images = [b64(pool[v]) for k, v in parts if k == "image"]
        if images:
            msg["images"] = images
        msgs.append(msg)
    return {"model": "llava", "messages": msgs, **extra}


def kept_in_order(kept: list[Any], images: list[Any], keep_recent: int) -> bool:
    """Whether `kept` are some of `images` in their order, byte for byte, the newest `keep_recent` among them (the cut
    takes repeated screens and tool output before the user's images, not always the oldest: trimflow._value)."""
    rest = iter(images)
    newest = min(keep_recent, len(images))
    return all(any(k == image for image in rest) for k in kept) and kept[len(kept) - newest :] == images[len(images) - newest :]
