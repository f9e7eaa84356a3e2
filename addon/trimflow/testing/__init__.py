"""Reproduce provider failures with no API key: the public test doubles of trimflow.

- `FakeProvider`: a local LLM API (OpenAI chat and Responses, Anthropic, Gemini, Bedrock, Ollama) that
  answers as the real one does, and refuses as a limit profile says (`rules/profiles.yaml`).
- `replay` and `Session`: send a synthetic screenshot session turn by turn and read each answer.
- `image`, `screenshot`, `session_body` and friends: real images made with Pillow and the
  whole-history request bodies agents send, in every wire format.

`python -m trimflow fake-provider` and `python -m trimflow replay` are the same tools on the command line.
"""

from ._fake_provider import REPLY_TEXT, FakeProvider, Received, count_images, estimate_usage
from ._replay import Row, Session, replay
from ._synthetic import MIME, PATHS, b64, data_url, image, screenshot, session_body

__all__ = [
    "MIME",
    "PATHS",
    "REPLY_TEXT",
    "FakeProvider",
    "Received",
    "Row",
    "Session",
    "b64",
    "count_images",
    "data_url",
    "estimate_usage",
    "image",
    "replay",
    "screenshot",
    "session_body",
]
