"""The corpus of real limit answers (tests/data/limit_answers.yaml, and the held-out set of
tests/data/limit_answers_held_out.yaml): every one read with the right kind and number, no look-alike read as a
limit. Run with -s for the table of answers per provider and each set's score."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from trimflow._limit_errors import FIELDS, load_patterns

DATA = Path(__file__).parent / "data"
CORPUS = yaml.safe_load((DATA / "limit_answers.yaml").read_text(encoding="utf-8"))
HELD_OUT = yaml.safe_load((DATA / "limit_answers_held_out.yaml").read_text(encoding="utf-8"))
ANSWERS: list[dict[str, Any]] = CORPUS["answers"] + HELD_OUT["answers"]
NOT_LIMITS: list[dict[str, Any]] = CORPUS["not_limits"] + HELD_OUT["not_limits"]
PATTERNS = load_patterns()


def body_of(entry: dict[str, Any]) -> bytes:
    """The answer as the provider sent it: the body the source shows, or its message in the provider's envelope."""
    if "body" in entry:
        return str(entry["body"]).encode()
    message, shape = entry["message"], entry["shape"]
    envelopes: dict[str, Any] = {
        "anthropic": {"type": "error", "error": {"type": "invalid_request_error", "message": message}},
        "openai": {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}},
        "google": {"error": {"code": entry["status"], "message": message, "status": "INVALID_ARGUMENT"}},
        "bedrock": {"message": message},
        "vllm": {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400},
        "dify": {"code": "invalid_param", "message": message, "status": 400},
    }
    return message.encode() if shape == "plain" else orjson.dumps(envelopes[shape])


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def ids(entries: list[dict[str, Any]]) -> list[str]:
    seen: Counter[str] = Counter()
    out = []
    for entry in entries:
        name = slug(entry["provider"])
        seen[name] += 1
        out.append(f"{name}-{seen[name]}")
    return out


@pytest.mark.parametrize("entry", ANSWERS, ids=ids(ANSWERS))
def test_every_real_limit_answer_is_read_with_its_kind_and_number(entry: dict[str, Any]) -> None:
    error = PATTERNS.recognise(entry["status"], body_of(entry), entry["host"] or "")
    assert error is not None, f"not recognised: {entry['source']}"
    assert (error.kind, error.value) == (entry["kind"], entry["value"]), f"{entry['source']} read by {error.pattern.name}"


@pytest.mark.parametrize("entry", NOT_LIMITS, ids=ids(NOT_LIMITS))
def test_no_look_alike_is_read_as_a_limit(entry: dict[str, Any]) -> None:
    error = PATTERNS.recognise(entry["status"], body_of(entry), entry["host"] or "")
    assert error is None, f"{entry['why']}, read as {error.kind} {error.value} by {error.pattern.name}"


def read_right(entry: dict[str, Any]) -> bool:
    error = PATTERNS.recognise(entry["status"], body_of(entry), entry["host"] or "")
    return error is not None and (error.kind, error.value) == (entry["kind"], entry["value"])


def read_at_all(entry: dict[str, Any]) -> bool:
    return PATTERNS.recognise(entry["status"], body_of(entry), entry["host"] or "") is not None


@pytest.mark.parametrize(("name", "corpus"), [("limit_answers.yaml", CORPUS), ("limit_answers_held_out.yaml", HELD_OUT)])
def test_each_set_is_scored(name: str, corpus: dict[str, Any]) -> None:
    """Every real answer of each set read right and no look-alike read, with the score printed per set."""
    right = sum(read_right(entry) for entry in corpus["answers"])
    read = sum(read_at_all(entry) for entry in corpus["not_limits"])
    print(f"\n{name}: {right} of {len(corpus['answers'])} real answers read right, {read} of {len(corpus['not_limits'])} look-alikes read")
    assert (right, read) == (len(corpus["answers"]), 0)


def test_the_corpus_is_real_and_broad() -> None:
    """At least 60 real answers from 20 providers, each with a public source; the table of what read them."""
    assert len(ANSWERS) >= 60
    providers = Counter(entry["provider"] for entry in ANSWERS)
    assert len(providers) >= 20
    for entry in ANSWERS:
        assert entry["source"].startswith("https://"), entry
        assert entry["kind"] in FIELDS and ("body" in entry) != ("message" in entry), entry
    readers: dict[str, Counter[str]] = {}
    for entry in ANSWERS:
        error = PATTERNS.recognise(entry["status"], body_of(entry), entry["host"] or "")
        reader = "none" if error is None else "general" if error.pattern.name == "general" else "catch-all" if error.pattern.catch_all else "named"
        readers.setdefault(entry["provider"], Counter())[reader] += 1
    look_alikes = Counter(entry["provider"] for entry in NOT_LIMITS)
    width = max(len(p) for p in set(providers) | set(look_alikes))
    print(f"\n{'provider':<{width}}  answers  named  general  catch-all  look-alikes")
    for provider in sorted(set(providers) | set(look_alikes)):
        counts = readers.get(provider, Counter())
        read = f"{counts['named']:>5}  {counts['general']:>7}  {counts['catch-all']:>9}"
        print(f"{provider:<{width}}  {providers[provider]:>7}  {read}  {look_alikes[provider]:>11}")
    total = Counter[str]()
    for counts in readers.values():
        total.update(counts)
    print(f"{'total':<{width}}  {len(ANSWERS):>7}  {total['named']:>5}  {total['general']:>7}  {total['catch-all']:>9}  {len(NOT_LIMITS):>11}")
    assert total["none"] == 0
