"""Limit profiles: what a provider refuses and exactly how it answers, to reproduce failures offline.

A profile (rules/profiles.yaml) holds limits (body bytes, image and media counts, per-image base64
bytes and pixel sizes) and the provider's answer (status, content type, body text with the measured
numbers filled in). `check` finds the first limit a request breaks; the proxy's `trimflow_simulate`
and `scripts/fake-provider --profile` answer with it. Pure Python, no mitmproxy.

The file is read with _yaml's line-aware reader, as the rules file is, so every error names the file and line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson
from yaml.nodes import MappingNode, Node, SequenceNode

from . import _jsoncodec
from ._human import parse_size
from ._imageinfo import sniff_media
from ._rules import builtin_rules
from ._yaml import NodeReader, did_you_mean, line_of, read_text, shipped_file
from .errors import ProfilesError, UnknownProfile
from .formats import FORMATS, IMAGE, Media, detect_shape

DEFAULT_PROFILES_PATH: Path = shipped_file("profiles.yaml")
OFF = "off"  # trimflow_simulate's value for "simulate nothing"; no profile may take the name

# Limits in the order they are checked: an oversize body is refused before anything reads it, then
# the counts, then each image.
SIZE_LIMITS = ("max_body_bytes", "max_image_base64_bytes")
COUNT_LIMITS = ("max_images", "max_media", "many_images_threshold")
SIDE_LIMITS = ("max_image_side", "many_images_max_side")
# A provider's limits, which a profile reproduces: not trimflow's own Limits (a provider counts media and
# base64 bytes its own way, and has no placeholder or batch).
PROFILE_LIMIT_FIELDS = (
    "max_body_bytes",
    "max_images",
    "max_media",
    "max_image_base64_bytes",
    "max_image_side",
    "many_images_threshold",
    "many_images_max_side",
)
RESPONSE_FIELDS = ("status", "content_type", "body")
TEMPLATE_FIELDS = (
    "limit",
    "body_bytes",
    "images",
    "documents",
    "media",
    "model",
    "image_path",
    "image_bytes",
    "width",
    "height",
)
_IMAGE_FIELDS = ("image_path", "image_bytes", "width", "height")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_TOP_KEYS = ("profiles",)

# Values a template is tried with at load time: numbers as ints (so {body_bytes:,} is checked as it
# will be used), and per-image fields as '?' as they are for a limit that is not about one image.
_ONE_IMAGE_SAMPLE: Mapping[str, Any] = {
    "limit": 100,
    "body_bytes": 2_100_000,
    "images": 101,
    "documents": 1,
    "media": 102,
    "model": "m",
    "image_path": "messages.0.content.2.image",
    "image_bytes": 6_000_000,
    "width": 9000,
    "height": 800,
}
_SAMPLES: tuple[Mapping[str, Any], ...] = (
    _ONE_IMAGE_SAMPLE,
    {**_ONE_IMAGE_SAMPLE, "image_path": "?", "image_bytes": "?", "width": "?", "height": "?"},
)


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    status: int
    content_type: str
    body: Any  # a text template, or JSON (dict/list) whose strings are templates
    max_body_bytes: int | None = None
    max_images: int | None = None
    max_media: int | None = None
    max_image_base64_bytes: int | None = None
    max_image_side: int | None = None
    many_images_threshold: int | None = None
    many_images_max_side: int | None = None
    line: int = field(default=0, compare=False)

    @property
    def limits(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in PROFILE_LIMIT_FIELDS if getattr(self, name) is not None}

    @property
    def needs_media(self) -> bool:
        return any(getattr(self, name) is not None for name in PROFILE_LIMIT_FIELDS if name != "max_body_bytes")

    @property
    def needs_pixels(self) -> bool:
        return self.max_image_side is not None or self.many_images_max_side is not None

    def render(self, values: Mapping[str, Any]) -> bytes:
        """The answer body with `values` (the TEMPLATE_FIELDS) filled in."""
        if isinstance(self.body, str):
            return self.body.format_map(values).encode("utf-8")
        return orjson.dumps(_fill_template(self.body, values))


def _fill_template(node: Any, values: Mapping[str, Any]) -> Any:
    if isinstance(node, str):
        return node.format_map(values)
    if isinstance(node, dict):
        return {key: _fill_template(value, values) for key, value in node.items()}
    if isinstance(node, list):
        return [_fill_template(value, values) for value in node]
    return node


@dataclass(frozen=True, slots=True)
class Violation:
    """The first limit a request broke, and the provider's answer to it."""

    profile: str
    limit: str  # the field of the profile that broke, e.g. "max_body_bytes"
    status: int
    content_type: str
    body: bytes


@dataclass(frozen=True)
class Profiles:
    """A loaded profiles file: profiles by name, in file order."""

    source: str
    profiles: Mapping[str, Profile]

    def names(self) -> list[str]:
        return list(self.profiles)

    def get(self, name: str) -> Profile:
        """The named profile; UnknownProfile (listing the known names) when there is none."""
        try:
            return self.profiles[name]
        except KeyError:
            hint = did_you_mean(name, self.profiles)
            known = ", ".join(self.profiles) or "none"
            raise UnknownProfile(f"unknown profile {name!r} in {self.source}{hint} (known: {known})") from None


# --- the check ---------------------------------------------------------------------------------


def check(profile: Profile, body: bytes, media: Sequence[Media] = (), *, model: str | None = None, parsed: Any = None) -> Violation | None:
    """The first limit of `profile` that this request breaks, with the filled answer; None if it passes.

    `body` is the request as forwarded, `media` what the format found in it (formats' find_media) and
    `parsed` the parsed body, used only to name an offending image's place Anthropic's way
    (messages.0.content.2.image: each list item followed by its block type).
    """
    images = [m for m in media if m.kind == IMAGE]
    values: dict[str, Any] = {
        "body_bytes": len(body),
        "images": len(images),
        "documents": len(media) - len(images),
        "media": len(media),
        "model": model or "unknown",
        "image_path": "?",
        "image_bytes": "?",
        "width": "?",
        "height": "?",
    }

    def broken(limit: str, image: Media | None = None, dims: tuple[int | None, int | None] = (None, None)) -> Violation:
        values["limit"] = getattr(profile, limit)
        if image is not None:
            values["image_path"] = image_path(parsed, image.path)
            values["image_bytes"] = image.payload_bytes
            values["width"] = "?" if dims[0] is None else dims[0]
            values["height"] = "?" if dims[1] is None else dims[1]
        return Violation(profile.name, limit, profile.status, profile.content_type, profile.render(values))

    if profile.max_body_bytes is not None and len(body) > profile.max_body_bytes:
        return broken("max_body_bytes")
    if profile.max_images is not None and len(images) > profile.max_images:
        return broken("max_images")
    if profile.max_media is not None and len(media) > profile.max_media:
        return broken("max_media")
    if profile.max_image_base64_bytes is not None:
        for image in images:
            if image.payload_bytes > profile.max_image_base64_bytes:
                return broken("max_image_base64_bytes", image)
    if profile.needs_pixels:
        side_limits = []
        if profile.max_image_side is not None:
            side_limits.append(("max_image_side", profile.max_image_side))
        if profile.many_images_max_side is not None and len(images) > (profile.many_images_threshold or 0):
            side_limits.append(("many_images_max_side", profile.many_images_max_side))
        for limit, max_side in side_limits:
            for image in images:
                dims = _dims(image)
                if max((d for d in dims if d is not None), default=0) > max_side:
                    return broken(limit, image, dims)
    return None


def check_request(profile: Profile, path: str, body: bytes, wire_format: str | None = None) -> Violation | None:
    """`check` for a request given by its URL path and body bytes. Never raises on a bad body: a body
    that is not JSON of a known format is checked for its size only."""
    if not profile.needs_media:
        return check(profile, body)
    path = path.partition("?")[0]
    try:
        parsed, _ = _jsoncodec.loads(body)
    except _jsoncodec.BodyError:
        return check(profile, body)
    fmt = wire_format or builtin_rules().format_for("", path) or detect_shape(parsed)
    if fmt not in FORMATS or not isinstance(parsed, dict):
        return check(profile, body)
    module = FORMATS[fmt]
    try:
        media = module.find_media(parsed)
        model = module.model(parsed, path)
    except Exception:  # noqa: BLE001 - a malformed body is the provider's to refuse, not ours to crash on
        return check(profile, body)
    return check(profile, body, media, model=model, parsed=parsed)


class _Request(Protocol):
    method: str
    path: str
    body: bytes


def provider_check(profile: Profile) -> Callable[[_Request], tuple[int, str, bytes] | None]:
    """A FakeProvider `check` hook that refuses requests breaking `profile`, as the provider would."""

    def answer(request: _Request) -> tuple[int, str, bytes] | None:
        if request.method != "POST":
            return None
        violation = check_request(profile, request.path, request.body)
        return None if violation is None else (violation.status, violation.content_type, violation.body)

    return answer


def image_path(parsed: Any, path: tuple[str | int, ...]) -> str:
    """An image's place in the body as Anthropic's errors spell it: "messages.0.content.2.image",
    "messages.5.content.0.tool_result.content.1.image" (each list item followed by its block type)."""
    parts: list[str] = []
    node = parsed
    for key in path:
        parts.append(str(key))
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            node = None
        if isinstance(key, int) and isinstance(node, dict) and isinstance(node.get("type"), str):
            parts.append(node["type"])
    return ".".join(parts)


def _dims(image: Media) -> tuple[int | None, int | None]:
    info = None if image.remote else sniff_media(image)
    return (info.width, info.height) if info is not None else (None, None)


# --- loading -----------------------------------------------------------------------------------


def load_profiles(path: str | os.PathLike[str] = DEFAULT_PROFILES_PATH) -> Profiles:
    """Read and parse a profiles file; any problem is a ProfilesError naming the file (and line)."""
    return parse_profiles(read_text(path, ProfilesError), os.fspath(path))


def parse_profiles(text: str, source: str = "<string>") -> Profiles:
    return _ProfilesReader(source).parse(text)


def select_profile(name: str, path: str | os.PathLike[str] = DEFAULT_PROFILES_PATH) -> Profile | None:
    """The profile to simulate for an option value: None for "off", else the named profile.
    Raises ProfilesError for a bad file and UnknownProfile for a name it does not define."""
    if name == OFF:
        return None
    return load_profiles(path).get(name)


class _ProfilesReader(NodeReader[Profiles]):
    """Reads a profiles file; _yaml.NodeReader walks the YAML and makes the file:line errors."""

    error_class = ProfilesError

    def top(self, root: Node | None) -> Profiles:
        top = self.top_mapping(
            root, "the profiles file", _TOP_KEYS, "empty profiles file: write `profiles:` with at least one profile (see rules/profiles.yaml)"
        )
        assert root is not None  # top_mapping refuses an empty file
        if "profiles" not in top:
            raise self.error(root, "no `profiles:` section")
        node = top["profiles"][1]
        entries = self.mapping(node, "profiles")
        if not entries:
            raise self.error(node, "profiles is empty: define at least one profile")
        profiles = {name: self.profile(name, knode, vnode) for name, (knode, vnode) in entries.items()}
        return Profiles(self.source, profiles)

    def profile(self, name: str, name_node: Node, node: Node) -> Profile:
        if name == OFF:
            raise self.error(name_node, f"profile name {OFF!r} is reserved: trimflow_simulate=off means no profile")
        if not _NAME_RE.fullmatch(name):
            raise self.error(name_node, f"profile name {name!r} must be letters, digits, '.', '_' or '-'")
        what = f"profile {name!r}"
        fields = self.mapping(node, what)
        self.reject_unknown(fields, (*PROFILE_LIMIT_FIELDS, *RESPONSE_FIELDS), what)
        values: dict[str, Any] = {}
        for key in PROFILE_LIMIT_FIELDS:
            if key in fields:
                values[key] = self.limit(key, fields[key][1], what)
        if not values:
            raise self.error(node, f"{what} has no limit: give at least one of {', '.join(PROFILE_LIMIT_FIELDS)}")
        pair = ("many_images_threshold", "many_images_max_side")
        if (pair[0] in values) != (pair[1] in values):
            given, missing = (pair[0], pair[1]) if pair[0] in values else (pair[1], pair[0])
            raise self.error(fields[given][0], f"{what}: {given} needs {missing} too")
        for key in RESPONSE_FIELDS:
            if key not in fields:
                raise self.error(node, f"{what} has no {key}: a profile answers with status, content_type and body")
        status_node = fields["status"][1]
        status = self.scalar(status_node)
        if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
            raise self.error(status_node, f"status must be an HTTP error status (400-599), got {self.describe(status_node)}")
        type_node = fields["content_type"][1]
        content_type = self.scalar(type_node)
        if not isinstance(content_type, str) or not content_type.strip():
            raise self.error(type_node, f"content_type must be text such as application/json, got {self.describe(type_node)}")
        body_node = fields["body"][1]
        body = self.body(body_node, what)
        if not isinstance(body, str) and "json" not in content_type.lower():
            raise self.error(
                body_node,
                f"{what}: a mapping or list body is sent as JSON, but content_type is {content_type!r}; use application/json or a text body",
            )
        return Profile(name, status, content_type, body, line=line_of(name_node), **values)

    def limit(self, key: str, node: Node, what: str) -> int:
        value = self.scalar(node)
        is_int = isinstance(value, int) and not isinstance(value, bool)
        if key in SIZE_LIMITS:
            if not is_int and not isinstance(value, str):
                raise self.error(node, f"{key} must be a size like 2MiB or 2097152, got {self.describe(node)}")
            try:
                size = parse_size(value)
            except ValueError as e:
                raise self.error(node, f"{key}: {e}") from None
            if size is None:
                raise self.error(node, f"{key} must be a size; leave the field out for no limit")
            return size
        lowest = 0 if key in COUNT_LIMITS else 1
        if is_int and value >= lowest:
            return value
        raise self.error(node, f"{key} must be a whole number >= {lowest}, got {self.describe(node)}")

    def body(self, node: Node, what: str) -> Any:
        """The body as Python (text, or JSON values), with every text checked as a template."""
        if isinstance(node, MappingNode):
            return {key: self.body(vnode, what) for key, (_, vnode) in self.mapping(node, f"the body of {what}").items()}
        if isinstance(node, SequenceNode):
            return [self.body(item, what) for item in node.value]
        value = self.scalar(node)
        if isinstance(value, str):
            self.template(node, value)
        elif value is not None and not isinstance(value, (bool, int, float)):
            raise self.error(node, f"the body of {what} holds {self.describe(node)}: use text, numbers, true/false/null, mappings and lists")
        return value

    def template(self, node: Node, text: str) -> None:
        fields = ", ".join("{" + f + "}" for f in TEMPLATE_FIELDS)
        for sample in _SAMPLES:
            try:
                text.format_map(sample)
            except KeyError as e:
                name = str(e.args[0])
                raise self.error(node, f"unknown field {{{name}}}{did_you_mean(name, TEMPLATE_FIELDS)}; fields: {fields}") from None
            except IndexError:
                raise self.error(node, f"a field without a name ({{}}); use one of {fields}") from None
            except (ValueError, AttributeError, TypeError) as e:
                hint = (
                    (f"; {', '.join('{' + f + '}' for f in _IMAGE_FIELDS)} are '?' when the broken limit is not about one image")
                    if sample["image_bytes"] == "?"
                    else "; write {{ and }} for a literal brace"
                )
                raise self.error(node, f"not a valid template ({e}){hint}") from None
