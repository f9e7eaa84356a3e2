"""The shared interface of the wire formats, and the helpers they all use."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

from .._media import AGENT, IMAGE, USER, JsonPath, Media, kind_of_mime, split_data_url
from .._placeholder import PLACEHOLDER_PREFIX


class WireFormat(Protocol):
    """What every format module provides. All functions are pure over parsed JSON."""

    NAME: str
    ENDPOINTS: tuple[str, ...]  # URL path globs of its endpoints, most specific first
    STREAM_SUFFIXES: tuple[str, ...]  # path endings that ask for a streamed answer
    # Token-count calls: (path ending of the count call, path ending of the turn it measures). A count call is
    # pruned as that turn would be and recorded as kind count_tokens, never as a turn.
    COUNT_ENDINGS: tuple[tuple[str, str], ...]
    ACCEPTS_WEBP: bool  # whether every provider and runtime behind the format decodes WebP (a shrunk image's type)

    def find_media(self, body: dict[str, Any]) -> list[Media]:
        """Every image and document in document order, each with its origin (trimflow._media: USER, TOOL, AGENT)."""
        ...

    def replace_media(self, body: dict[str, Any], texts: Mapping[JsonPath, str]) -> dict[str, Any]:
        """A new body where each media at a path of `texts` is a text placeholder; `body` is untouched."""
        ...

    def replace_data(self, body: dict[str, Any], images: Mapping[JsonPath, tuple[str, str]]) -> dict[str, Any]:
        """A new body where each image at a path of `images` carries new bytes: (base64, mime).

        The declared type follows the new bytes (data URL prefix, media_type, mime_type, format);
        everything else of the part is kept; `body` is untouched.
        """
        ...

    def add_notes(self, body: dict[str, Any], notes: Mapping[JsonPath, str]) -> dict[str, Any]:
        """A new body where each note (keyed by the path of the image it speaks of) is a text part at the end of
        that image's message, or of the tool result holding it; no other part moves; `body` is untouched."""
        ...

    def model(self, body: dict[str, Any], path: str) -> str | None: ...

    def matches_shape(self, body: dict[str, Any]) -> bool:
        """Whether a body with no known endpoint path looks like this format."""
        ...

    def history(self, body: dict[str, Any]) -> HistoryParts:
        """Where the body keeps its conversation: the messages, and what sets them up."""
        ...

    def is_warmup(self, body: dict[str, Any]) -> bool:
        """Whether the request only prepares the next turn (no answer): a warm-up, not a turn."""
        ...

    def server_side_history(self, body: dict[str, Any]) -> bool:
        """Whether the earlier turns live at the provider (the request names them instead of sending them)."""
        ...

    def cache_lifetime(self, body: dict[str, Any]) -> float | None:
        """Seconds the provider keeps the cached prefix holding the request's images when the request asks for
        longer than its default (Anthropic's `"ttl": "1h"`, OpenAI's `prompt_cache_retention`); None: the default,
        the rules' `cache_ttl`."""
        ...


class HistoryParts(NamedTuple):
    """A request's conversation as its format lays it out (trimflow._history digests it)."""

    request: dict[str, Any]  # the request proper, where session fields live (a wrapper's inner request)
    head: Any  # what sets the conversation up outside its messages: system prompt, instructions (None if none)
    items: list[Any]  # the messages (items, contents), oldest first
    path: JsonPath  # where `items` sits in the body: a media path below it names its item


def url_media(kind: str, path: JsonPath, url: Any, detail: str | None = None, origin: str = USER) -> Media | None:
    """Media for an image or file URL: a base64 data URL carries bytes, anything else is remote."""
    if not isinstance(url, str):
        return None
    parsed = split_data_url(url)
    if parsed is None:
        return Media(kind, path, None, 0, None, detail, origin)
    mime, offset = parsed
    media_kind = kind if kind != IMAGE or mime is None else kind_of_mime(mime)
    return Media(media_kind, path, url, offset, mime, detail, origin)


def user_or_agent(after_tool: bool, parts: Any, is_image: Callable[[dict[str, Any]], bool], text: Callable[[dict[str, Any]], Any]) -> str:
    """The origin of the images of a user message: the agent's when the message comes right after a tool's result and
    holds nothing but images (the screenshot an agent sends after a tool call where the tool result takes no image);
    else the user's. A text part trimflow wrote (a placeholder, a note) is not the message's own."""
    if not after_tool:
        return USER
    images = 0
    for _, part in dicts(parts):
        if is_image(part):
            images += 1
            continue
        value = text(part)
        if not (isinstance(value, str) and value.startswith(PLACEHOLDER_PREFIX)):
            return USER
    return AGENT if images else USER


def rebuild(node: Any, edits: Mapping[JsonPath, Callable[[Any], Any]]) -> Any:
    """Copy `node` with each path's value passed through its function.

    Only the containers on the edited paths are copied (shallowly); everything else is shared,
    so the input is never mutated and a 16 MB body is not duplicated.
    """
    if () in edits:
        return edits[()](node)
    groups: dict[str | int, dict[JsonPath, Callable[[Any], Any]]] = {}
    for path, edit in edits.items():
        groups.setdefault(path[0], {})[path[1:]] = edit
    copy: Any = list(node) if isinstance(node, list) else dict(node)
    for key, sub in groups.items():
        copy[key] = rebuild(node[key], sub)
    return copy


def replace_parts(body: dict[str, Any], texts: Mapping[JsonPath, str], make_part: Callable[[Any, str], Any]) -> dict[str, Any]:
    """Replace each part at a path of `texts` with make_part(old_part, text)."""
    edits = {path: (lambda old, text=text: make_part(old, text)) for path, text in texts.items()}
    return rebuild(body, edits)


def text_part(old: Any, text: str) -> dict[str, Any]:
    """A `{"type": "text"}` part in place of `old` (Anthropic's blocks, OpenAI chat's content parts), keeping the
    `cache_control` breakpoint `old` carried, so that the cached prefix ends where it did. Gateways that route chat
    requests to Claude (OpenRouter, LiteLLM) take Anthropic's breakpoints on chat content parts too."""
    part: dict[str, Any] = {"type": "text", "text": text}
    if isinstance(old, dict) and "cache_control" in old:
        part["cache_control"] = old["cache_control"]
    return part


def replace_images(body: dict[str, Any], images: Mapping[JsonPath, tuple[str, str]], make_part: Callable[[Any, str, str], Any]) -> dict[str, Any]:
    """Replace each part at a path of `images` with make_part(old_part, base64, mime)."""
    edits = {path: (lambda old, new=new: make_part(old, *new)) for path, new in images.items()}
    return rebuild(body, edits)


def append_notes(
    body: dict[str, Any],
    notes: Mapping[JsonPath, str],
    make_part: Callable[[str], Any],
    holder: Callable[[JsonPath], JsonPath] = lambda path: path[:-1],
) -> dict[str, Any]:
    """add_notes for the formats whose image parts sit in a list that takes text parts: each note goes at the end
    of the list `holder` names for its image (by default the one holding the image), in the notes' order.
    Appending moves no part, so every other path stays valid. A holder that is not a list gets no note."""
    groups: dict[JsonPath, list[str]] = {}
    for path, text in notes.items():
        groups.setdefault(holder(path), []).append(text)

    def append(texts: list[str]) -> Callable[[Any], Any]:
        return lambda node: [*node, *(make_part(text) for text in texts)] if isinstance(node, list) else node

    # One list at a time: a tool result's list sits inside its message's, and rebuild edits one of two nested paths.
    for holder_path, texts in groups.items():
        body = rebuild(body, {holder_path: append(texts)})
    return body


def default_lifetime(body: dict[str, Any]) -> float | None:
    """`cache_lifetime` of a format whose requests cannot ask for a longer prompt cache lifetime."""
    return None


_BREAKPOINT_TTLS = {"5m": 300.0, "1h": 3600.0}  # what a Claude cache breakpoint's `ttl` may ask for (Anthropic, Bedrock)


def breakpoint_ttl(breakpoint: Any) -> float | None:
    """Seconds a cache breakpoint (`cache_control`, Bedrock's `cachePoint`) asks its entry to live; None: not said."""
    ttl = breakpoint.get("ttl") if isinstance(breakpoint, dict) else None
    return _BREAKPOINT_TTLS.get(ttl) if isinstance(ttl, str) else None


def longest_message_ttl(body: dict[str, Any], key: str) -> float | None:
    """The longest `breakpoint_ttl` of the breakpoints under `key` on the blocks of `messages[].content[]`: those that
    cache the messages, where images sit (a longer-lived tools or system breakpoint leaves them uncached all the same)."""
    longest = None
    for _, message in dicts(body.get("messages")):
        for _, block in dicts(message.get("content")):
            ttl = breakpoint_ttl(block.get(key))
            if ttl is not None and (longest is None or ttl > longest):
                longest = ttl
    return longest


def never(body: dict[str, Any]) -> bool:
    """`is_warmup` and `server_side_history` of a format that has neither: every request is a turn, whole."""
    return False


def dicts(value: Any) -> list[tuple[int, dict[str, Any]]]:
    """(index, item) for the dict items of a list; anything else yields nothing (malformed input passes)."""
    if not isinstance(value, list):
        return []
    return [(i, item) for i, item in enumerate(value) if isinstance(item, dict)]


def listed(value: Any) -> list[Any]:
    """`value` when it is a list, else no items (malformed input passes)."""
    return value if isinstance(value, list) else []
