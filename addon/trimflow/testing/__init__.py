"""Reproduce provider failures with no API key: the public test doubles of trimflow.

- `FakeProvider`: a local LLM API (OpenAI chat and Responses, Anthropic, Gemini, Bedrock, Ollama) that
  answers as the real one does, and refuses as a limit profile says (`rules/profiles.yaml`).
- `replay` and `Session`: send a synthetic screenshot session turn by turn and read each answer.
- `image`, `screenshot`, `session_body` and friends: real images made with Pillow and the
  whole-history request bodies agents send, in every wire format.
- `CacheModel`: each provider's documented prompt caching, on a clock you give it (`FakeProvider(cache=True)`
  runs it). What each pruning policy costs against it is research beside the bench, not in the package
  (tests/research, `scripts/replay --policies`).

`python -m trimflow fake-provider` and `python -m trimflow replay` are the same tools on the command line.
"""

from ._cache_model import CacheModel, CacheUsage
from ._fake_provider import FakeProvider, Received
from ._fake_usage import REPLY_TEXT, count_images, estimate_usage
from ._replay import ReplayedTurn, Session, replay
from ._synthetic import MIME, PATHS, b64, data_url, image, screenshot, session_body

__all__ = [
    "MIME",
    "PATHS",
    "REPLY_TEXT",
    "CacheModel",
    "CacheUsage",
    "FakeProvider",
    "Received",
    "ReplayedTurn",
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
