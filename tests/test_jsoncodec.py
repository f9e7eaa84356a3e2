"""trimflow._jsoncodec: orjson for the usual body, the standard library, exactly, for what orjson refuses or would
change; a clear BodyError, quoting nothing of the body, for what no parser takes."""

from __future__ import annotations

import json
import math
import sys

import orjson
import pytest

from trimflow._jsoncodec import dumps, loads
from trimflow.errors import BodyError

MARK = "body-text-never-quoted-41c"


def test_a_usual_body_takes_orjson_and_writes_compact() -> None:
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hé 😀"}], "n": 2**53, "t": 0.5})
    parsed, fallback = loads(body)
    assert not fallback and parsed["n"] == 2**53
    assert dumps(parsed, fallback) == body


@pytest.mark.parametrize(
    ("body", "check"),
    [
        (b'{"seed":123456789012345678901234567890}', lambda v: v["seed"] == 123456789012345678901234567890),
        (b'{"n":-9223372036854775809}', lambda v: v["n"] == -(2**63) - 1),
        (b'{"t":NaN,"u":Infinity,"v":-Infinity}', lambda v: math.isnan(v["t"]) and v["u"] == math.inf and v["v"] == -math.inf),
    ],
)
def test_what_orjson_refuses_or_would_change_takes_the_exact_parser(body: bytes, check) -> None:
    parsed, fallback = loads(body)
    assert fallback and check(parsed)
    assert dumps(parsed, fallback) == body.replace(b" ", b"")  # written back as it came


def test_nesting_deeper_than_orjson_allows_takes_the_exact_parser_where_it_can() -> None:
    body = b"[" * 1100 + b"]" * 1100  # deeper than orjson's 1024
    if sys.version_info < (3, 12):
        # Python 3.11's json stops at its recursion limit (1000): the body is refused, never half-read.
        with pytest.raises(BodyError, match="nested too deeply to parse"):
            loads(body)
        return
    parsed, fallback = loads(body)
    assert fallback and isinstance(parsed, list)
    assert dumps(parsed, fallback) == body


@pytest.mark.parametrize(
    "body",
    [
        b'{"id":"call_1234567890123456789012","x":1}',
        b'{"log":"at 1732680000123456789 ns: ok","ids":["99999999999999999999"]}',
        b'{"t":"0.12345678901234567890123"}',
    ],
)
def test_a_long_digit_run_inside_a_string_stays_on_orjson_and_changes_nothing(body: bytes) -> None:
    parsed, fallback = loads(body)
    assert not fallback and parsed == json.loads(body)
    assert dumps(parsed, fallback) == body


@pytest.mark.parametrize(
    "body",
    [
        b"[12345678901234567890]",
        b'{"a": [1, -12345678901234567890]}',
        b'{"a":\n\t 12345678901234567890.5e3}',
        b'{"quoted":"{\\"n\\":12345678901234567890}"}',  # quoted JSON: taken for a number, which costs only time
    ],
)
def test_a_long_digit_run_where_a_number_stands_takes_the_exact_parser(body: bytes) -> None:
    parsed, fallback = loads(body)
    assert fallback and parsed == json.loads(body)


def test_an_18_digit_integer_stays_on_orjson() -> None:
    parsed, fallback = loads(b'{"n":123456789012345678}')
    assert not fallback and parsed["n"] == 123456789012345678


def test_orjson_would_read_a_20_digit_integer_as_a_float() -> None:
    # Why the scan exists: the fast parser changes the value where the exact one keeps it.
    assert orjson.loads(b"12345678901234567890123") != 12345678901234567890123
    assert loads(b"12345678901234567890123") == (12345678901234567890123, True)


def test_a_lone_surrogate_is_written_back_as_its_escape() -> None:
    body = b'{"text":"a \\ud800 b","ok":"\xc3\xa9"}'
    parsed, _ = loads(body)
    out = dumps(parsed, True)
    assert b"\\ud800" in out and json.loads(out) == parsed


def test_dumps_falls_back_for_a_value_orjson_cannot_write_even_unasked() -> None:
    value = {"n": 2**70, "s": "é"}
    assert dumps(value, False) == b'{"n":1180591620717411303424,"s":"\xc3\xa9"}'


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b'{"a": "' + MARK.encode() + b'" \xff}', "body is not UTF-8 (invalid byte at offset"),
        (b'{"a": "' + MARK.encode() + b'",,}', "body is not JSON (Expecting property name enclosed in double quotes at line 1 column"),
        (b'{"a": "' + MARK.encode() + b'", "x": 1e400}', "body has a number too large for a double"),
        (b"[" * 200_000 + b"]" * 200_000, "body is JSON nested too deeply to parse"),
        (b"", "body is not JSON"),
    ],
)
def test_bodies_no_parser_takes_raise_a_body_error_that_quotes_nothing(body: bytes, says: str) -> None:
    with pytest.raises(BodyError) as caught:
        loads(body)
    assert str(caught.value).startswith(says), str(caught.value)
    assert MARK not in str(caught.value)
    assert isinstance(caught.value, ValueError)  # callers that catch ValueError keep working


def test_a_value_nested_too_deeply_to_write_is_a_body_error() -> None:
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(BodyError, match="nested too deeply to write"):
        dumps(deep, True)
