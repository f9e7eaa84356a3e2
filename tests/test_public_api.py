"""The public surface: what each public part exports, pinned so that a change to it is deliberate.

Everything else (modules whose names start with `_`) may change without notice.
"""

from __future__ import annotations

import importlib

import pytest

PUBLIC = {
    "trimflow": [
        "BodyError",
        "DEFAULT_PLACEHOLDER",
        "DEFAULT_RULES_PATH",
        "DecodeError",
        "ENFORCE",
        "ExpressionError",
        "FORMATS",
        "InputError",
        "Limits",
        "MODES",
        "Media",
        "NeedsWorker",
        "OBSERVE",
        "Outcome",
        "ProfilesError",
        "Record",
        "Rules",
        "RulesError",
        "RulesFile",
        "SessionError",
        "Target",
        "TrimflowError",
        "UnknownProfile",
        "builtin_rules",
        "detect_shape",
        "load_rules",
        "parse_rules",
        "prune",
        "prune_request",
    ],
    "trimflow.audit": [
        "Breach",
        "Conversation",
        "Crossing",
        "Expression",
        "ExpressionError",
        "Gate",
        "InputError",
        "InputTally",
        "ProfileLimits",
        "Reader",
        "Row",
        "Summary",
        "Totals",
        "UNKNOWN_CONVERSATION",
        "evaluate",
        "main",
        "parse_expression",
        "recalls_text",
        "summarize",
        "usage_text",
    ],
    "trimflow.testing": [
        "CacheModel",
        "CacheUsage",
        "FakeProvider",
        "MIME",
        "PATHS",
        "REPLY_TEXT",
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
    ],
    "trimflow.proxy": [
        "Clicks",
        "FLUSH_DELAY",
        "FlowState",
        "SharedState",
        "ShareConversations",
        "GeminiKeyHeader",
        "META",
        "KeepMemory",
        "Metrics",
        "OpenTelemetry",
        "Options",
        "Prometheus",
        "Prune",
        "Recall",
        "Recover",
        "HoldRefusals",
        "SendOnce",
        "Simulate",
        "UpstreamAuthPipe",
        "WebSocket",
        "make_addons",  # builds the list: importing trimflow.proxy builds nothing (tests/proxy/test_loading.py)
    ],
    "trimflow.repair": [
        "AGENTS",
        "FileReport",
        "Repaired",
        "Replay",
        "SessionError",
        "repair_file",
        "repair_lines",
        "session_paths",
    ],
    "trimflow.errors": [
        "BodyError",
        "DecodeError",
        "ExpressionError",
        "InputError",
        "ProfilesError",
        "RulesError",
        "SessionError",
        "TrimflowError",
        "UnknownProfile",
    ],
}


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_all_is_pinned_and_every_name_resolves(name: str) -> None:
    module = importlib.import_module(name)
    assert sorted(module.__all__) == sorted(PUBLIC[name])
    for attr in module.__all__:
        assert getattr(module, attr) is not None, f"{name}.{attr}"


def test_every_error_is_a_trimflow_error_and_keeps_its_builtin_base() -> None:
    import trimflow

    for name in PUBLIC["trimflow.errors"]:
        error = getattr(trimflow, name)
        assert issubclass(error, trimflow.TrimflowError)
    assert issubclass(trimflow.RulesError, ValueError) and issubclass(trimflow.ProfilesError, trimflow.RulesError)
