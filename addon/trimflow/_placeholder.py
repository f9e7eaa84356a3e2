"""The text that stands where a pruned image was.

It says what was there and depends only on the image itself and its ordinal in the conversation,
so the same image gets the same text on every later turn and a provider's cached prefix survives.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._imageinfo import ImageInfo
from ._sizes import format_size
from .formats import Media

# The fields a template may use; _rules validates templates against these.
PLACEHOLDER_FIELDS = ("kind", "ordinal", "mime", "dims", "size", "bytes", "width", "height", "reason")
# A repeat's placeholder may also name the later image it repeats as.
REPEAT_FIELDS = (*PLACEHOLDER_FIELDS, "later")


@dataclass(frozen=True, slots=True)
class MediaFacts:
    """What is known of one media item: its wire form and what its header says."""

    media: Media
    ordinal: int  # 1-based among the request's media of the same kind, in document order
    info: ImageInfo | None

    @property
    def mime(self) -> str | None:
        if self.info is not None:
            return self.info.mime
        return self.media.declared_mime

    @property
    def decoded_bytes(self) -> int:
        return (self.media.wire_bytes - self.media.data_offset) * 3 // 4


def render(template: str, facts: MediaFacts, reason: str, **extra: object) -> str:
    """The template filled in for this image; `extra` adds fields (a repeat's {later})."""
    info = facts.info
    width = info.width if info is not None else None
    height = info.height if info is not None else None
    values = {
        "kind": facts.media.kind,
        "ordinal": facts.ordinal,
        "mime": facts.mime or "unknown type",
        "dims": f"{width}x{height}" if width and height else "unknown size",
        "size": "remote" if facts.media.remote else format_size(facts.decoded_bytes),
        "bytes": facts.media.wire_bytes,
        "width": width if width is not None else "?",
        "height": height if height is not None else "?",
        "reason": reason,
        **extra,
    }
    return template.format_map(values)


def rescale_note(facts: MediaFacts, width: int, height: int, computer_use: bool = False) -> str:
    """The text sent beside an image that goes at other dimensions than it came: it depends only on the image and
    its new size, so it reads the same on every turn (a cached prefix survives). The scale is new width / old.

    In a request that declares a computer tool the proxy maps the answer's clicks back to the original screen
    (trimflow._clicks), so the note asks for coordinates in the image as sent: a model that scaled them itself from
    the sizes the note gives would be mapped twice."""
    info = facts.info
    assert info is not None and info.width and info.height, "only an image of known size is rescaled"
    scale = width / info.width
    coordinates = "; answer coordinates in this image's pixels" if computer_use else ""
    return f"[trimflow: image #{facts.ordinal} was resized from {info.width}x{info.height} to {width}x{height} (scale {scale:.4g}){coordinates}]"
