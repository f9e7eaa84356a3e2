"""What the fake provider says a request cost: a deterministic token estimate from the body, realistic in magnitude,
or (with its cache model) what the cache read and wrote.

    input_tokens  = ceil((body_bytes - base64_bytes) / 4) + 1600 * images
    output_tokens = ceil(len(REPLY_TEXT) / 4)

``body_bytes`` is the decoded body length; ``base64_bytes`` the total length of runs of 256 or more base64
characters (image payloads, in the standard or the URL-safe alphabet); ``images`` counts image markers with a
regex scan, without parsing (see `count_images`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ._cache_model import CacheUsage

REPLY_TEXT = "ok from fake-provider"
# The reply streamed as a few deltas; joined they give REPLY_TEXT.
REPLY_DELTAS = ("ok", " from", " fake", "-provider")
assert "".join(REPLY_DELTAS) == REPLY_TEXT

IMAGE_TOKENS = 1600


# --- usage estimate ----------------------------------------------------------------------------------------

_B64_RUN = re.compile(rb"[A-Za-z0-9+/_-]{256,}={0,2}")  # both alphabets: standard (+/) and URL-safe (-_)
_IMAGE_MARKER = re.compile(
    rb'"type"\s*:\s*"(?:image_url|input_image|computer_screenshot|image)"'  # OpenAI chat, Responses (computer use too), Anthropic
    rb'|"(?:inline_data|inlineData)"\s*:'  # Gemini, both spellings
    rb'|"image"\s*:\s*\{'  # Bedrock Converse
)
# Ollama images are raw base64 strings, which contain neither quotes nor brackets.
_OLLAMA_IMAGES = re.compile(rb'"images"\s*:\s*\[([^\]]*)\]')


def count_images(body: bytes) -> int:
    """Images in a request body of any supported format, by a cheap marker scan."""
    n = len(_IMAGE_MARKER.findall(body))
    for m in _OLLAMA_IMAGES.finditer(body):
        n += m.group(1).count(b'"') // 2
    return n


def base64_bytes(body: bytes) -> int:
    """Bytes in long base64 runs: the image payloads that count as images, not as text."""
    return sum(m.end() - m.start() for m in _B64_RUN.finditer(body))


@dataclass(frozen=True, slots=True)
class FakeUsage:
    """The token usage the provider reports for one request (see the module docstring for the formula).

    `input_tokens` is the whole prompt. The cache fields are None when the provider models no cache
    (`FakeProvider(cache=False)`): the answers then carry the fixed zeros they always had.
    """

    input_tokens: int
    output_tokens: int
    images: int = 0
    image_tokens: int = 0
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    cache_write_1h_tokens: int = 0
    cached_image_tokens: int = 0

    @property
    def uncached_tokens(self) -> int:
        return self.input_tokens - (self.cache_read_tokens or 0) - (self.cache_write_tokens or 0)

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


def cached_usage(cached: CacheUsage, images: int) -> FakeUsage:
    """The usage of a request the cache model answered: its token counts, and the reply's output."""
    return FakeUsage(
        input_tokens=cached.prompt_tokens,
        output_tokens=math.ceil(len(REPLY_TEXT) / 4),
        images=images,
        image_tokens=cached.image_tokens,
        cache_read_tokens=cached.cache_read_tokens,
        cache_write_tokens=cached.cache_write_tokens,
        cache_write_1h_tokens=cached.cache_write_1h_tokens,
        cached_image_tokens=cached.cached_image_tokens,
    )


def estimate_usage(body: bytes) -> FakeUsage:
    images = count_images(body)
    text_bytes = max(len(body) - base64_bytes(body), 0)
    image_tokens = IMAGE_TOKENS * images
    return FakeUsage(
        input_tokens=math.ceil(text_bytes / 4) + image_tokens,
        output_tokens=math.ceil(len(REPLY_TEXT) / 4),
        images=images,
        image_tokens=image_tokens,
    )
