"""The texts trimflow writes into a request: the placeholder that stands where a pruned image was (and the check of a
rules file's template for it), and the note beside an image sent at other dimensions.

Each depends only on the image itself and its ordinal in the conversation, so the same image gets the same text on
every later turn and a provider's cached prefix survives. With recall on (trimflow._recall), an image's text also
names its id, a digest of its bytes, and the tool that brings it back; with recall off it never offers recall.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ._human import format_size
from ._imageinfo import ImageInfo
from ._media import Media
from ._yaml import did_you_mean

# The fields a template may use; _rules validates templates against these.
PLACEHOLDER_FIELDS = ("kind", "ordinal", "mime", "dims", "size", "bytes", "width", "height", "reason", "id")
# A repeat's placeholder may also name the later image it repeats as.
REPEAT_FIELDS = (*PLACEHOLDER_FIELDS, "later")

# A text placeholder trimflow wrote in place of an image starts with this (the default templates do).
PLACEHOLDER_PREFIX = "[trimflow:"
DEFAULT_PLACEHOLDER = "[trimflow: {kind} #{ordinal} omitted ({mime}, {dims}, {size})]"
# The default with recall on: {id} names the image for the MCP tool recall_image (trimflow._recall.TOOL).
DEFAULT_RECALL_PLACEHOLDER = '[trimflow: {kind} #{ordinal} omitted ({mime}, {dims}, {size}); recall_image("{id}") brings it back]'
# Stands where an image was that the same request sends again later; {later} is that image's ordinal.
DEFAULT_REPEAT_PLACEHOLDER = "[trimflow: image #{ordinal} repeated as image #{later}]"
# Stands where a screenshot was that shows the same screen as the image after it (trimflow._lookalike), {later}.
DEFAULT_LOOKALIKE_PLACEHOLDER = "[trimflow: image #{ordinal} omitted: the same screen as image #{later}]"


class ImageIds(Protocol):
    """With recall on, an image's id (trimflow._recall.RecallIds): None for one that has no bytes here."""

    def of(self, media: Media) -> str | None: ...


@dataclass(frozen=True, slots=True)
class MediaFacts:
    """What is known of one media item: its wire form and what its header says; `ids` when recall is on."""

    media: Media
    ordinal: int  # 1-based among the request's media of the same kind, in document order
    info: ImageInfo | None
    ids: ImageIds | None = None

    def recall_id(self) -> str | None:
        """The image's id, with recall on (hashed on first use, for an image whose text names it)."""
        return self.ids.of(self.media) if self.ids is not None and self.media.kind == "image" else None

    @property
    def mime(self) -> str | None:
        if self.info is not None:
            return self.info.mime
        return self.media.declared_mime

    @property
    def decoded_bytes(self) -> int:
        return (self.media.wire_bytes - self.media.data_offset) * 3 // 4


def render(template: str, facts: MediaFacts, reason: str, **extra: object) -> str:
    """The template filled in for this image; `extra` adds fields (a repeat's {later}). With recall on, the default
    template is DEFAULT_RECALL_PLACEHOLDER; {id} is empty for an image with no id (recall off, a remote image)."""
    image = facts.recall_id() if "{id" in template or template == DEFAULT_PLACEHOLDER else None
    if template == DEFAULT_PLACEHOLDER and image is not None:
        template = DEFAULT_RECALL_PLACEHOLDER
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
        "id": image or "",
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
    image = facts.recall_id()
    original = f'; recall_image("{image}") brings the original' if image is not None else ""
    resized = f"was resized from {info.width}x{info.height} to {width}x{height} (scale {scale:.4g})"
    return f"[trimflow: image #{facts.ordinal} {resized}{coordinates}{original}]"


# Sample values for checking a placeholder template at load time, in the types _placeholder.render
# passes: numbers are ints so a format spec such as {bytes:,} is checked as it will be used, and
# the second set has width/height unknown ("?") as they are for an unreadable image.
_PLACEHOLDER_SAMPLES: tuple[Mapping[str, Any], ...] = (
    {
        "kind": "image",
        "ordinal": 3,
        "mime": "image/png",
        "dims": "1024x768",
        "size": "669KB",
        "bytes": 685_000,
        "width": 1024,
        "height": 768,
        "reason": "max_images",
        "id": "k3x7q2m5ta",
    },
    {
        "kind": "document",
        "ordinal": 1,
        "mime": "unknown type",
        "dims": "unknown size",
        "size": "remote",
        "bytes": 120,
        "width": "?",
        "height": "?",
        "reason": "max_body_bytes",
        "id": "",
    },
)


def check_placeholder(template: str, field: str = "placeholder") -> None:
    """Raise ValueError unless `template` formats with the known placeholder fields.

    `field` is the rules field it is for: "repeat_placeholder" and "lookalike_placeholder" also know {later}.
    """
    known = REPEAT_FIELDS if field in ("repeat_placeholder", "lookalike_placeholder") else PLACEHOLDER_FIELDS
    fields = ", ".join("{" + f + "}" for f in known)
    for i, sample in enumerate(_PLACEHOLDER_SAMPLES):
        unknown_dims = "; {width} and {height} are '?' when an image's size is unknown" if i else ""
        try:
            template.format(**sample, **({"later": 7} if "later" in known else {}))
        except KeyError as e:
            name = str(e.args[0])
            raise ValueError(f"{field} has an unknown field {{{name}}}{did_you_mean(name, known)}; fields: {fields}") from None
        except IndexError:
            raise ValueError(f"{field} has a field without a name ({{}}); use one of {fields}") from None
        except ValueError as e:
            hint = unknown_dims or "; write {{ and }} for a literal brace"
            raise ValueError(f"{field} is not a valid template ({e}){hint}") from None
        except (AttributeError, TypeError) as e:
            raise ValueError(f"{field} is not a valid template ({e}){unknown_dims}") from None
    if not template.strip():
        # Some providers reject an empty text block; a placeholder must say something.
        raise ValueError(f"{field} must not be empty")
