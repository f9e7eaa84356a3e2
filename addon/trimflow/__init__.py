"""trimflow: keep LLM agent requests under provider image and size limits, at the wire.

The engine is pure Python; `addon/mitm.py` is the mitmproxy addon that runs it on live traffic.
"""

from ._engine import ENFORCE, MODES, OBSERVE, NeedsWorker, Outcome, is_sigv4, prune, prune_request
from ._policy import DEFAULT_PLACEHOLDER, Limits, count_pruned
from ._record import Record
from .formats import FORMATS, Media, detect_shape

__all__ = [
    "DEFAULT_PLACEHOLDER",
    "ENFORCE",
    "FORMATS",
    "Limits",
    "MODES",
    "Media",
    "NeedsWorker",
    "OBSERVE",
    "Outcome",
    "Record",
    "count_pruned",
    "detect_shape",
    "is_sigv4",
    "prune",
    "prune_request",
]
