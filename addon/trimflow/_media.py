"""The vocabulary the formats, the policy and the engine share: a medium found in a request (`Media`), where it sits
(`JsonPath`), its kinds, and base64 data URLs. No format, no policy: each of those imports this."""

from __future__ import annotations

from dataclasses import dataclass

JsonPath = tuple[str | int, ...]

IMAGE = "image"
DOCUMENT = "document"

# Where a medium came from (`Media.origin`), as its format module reads it from the message around it: attached by
# the user in a turn of theirs; returned by a tool (a tool result); or attached by the agent (the screenshot it sends
# as a user message right after a tool call or beside a tool result, an image in an assistant turn). The cut takes
# the user's images last (trimflow._value).
USER, TOOL, AGENT = "user", "tool", "agent"
ORIGINS = (USER, TOOL, AGENT)


@dataclass(frozen=True, slots=True)
class Media:
    """One image or document found in a request, in document order."""

    kind: str  # image, document, audio or video
    path: JsonPath  # the part a placeholder replaces
    data: str | None  # the wire text (raw base64 or a whole data URL); None for remote media
    data_offset: int = 0  # where the base64 starts inside `data` (after "data:...;base64,")
    declared_mime: str | None = None
    detail: str | None = None  # OpenAI's image detail, which changes its token count
    origin: str = USER  # USER, TOOL or AGENT

    @property
    def remote(self) -> bool:
        return self.data is None

    @property
    def wire_bytes(self) -> int:
        return len(self.data) if self.data is not None else 0

    @property
    def payload_bytes(self) -> int:
        """The base64 length of the data, without a data URL's header (what `max_image_bytes` limits)."""
        return self.wire_bytes - self.data_offset

    def base64_prefix(self, chars: int) -> str:
        """The first `chars` characters of the base64 payload, without copying the rest."""
        if self.data is None:
            return ""
        return self.data[self.data_offset : self.data_offset + chars]


def kind_of_mime(mime: str | None) -> str:
    if not mime:
        return DOCUMENT
    top = mime.split("/", 1)[0].lower()
    if top in ("image", "audio", "video"):
        return top
    return DOCUMENT


def split_data_url(url: str) -> tuple[str | None, int] | None:
    """('image/png', offset of the payload) for a base64 data URL, else None. Copies no payload."""
    if not url.startswith("data:"):
        return None
    comma = url.find(",", 5, 512)
    if comma < 0:
        return None
    header = url[5:comma]
    if not header.endswith(";base64"):
        return None
    mime = header[: -len(";base64")].split(";", 1)[0] or None
    return mime, comma + 1


def data_url(data: str, mime: str) -> str:
    return f"data:{mime};base64,{data}"
