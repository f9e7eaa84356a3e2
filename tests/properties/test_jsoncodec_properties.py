"""The JSON codec against the standard library: whatever integers a body holds and however it is spaced, the value
read is the exact one (an integer orjson would read as a float takes the exact parser), and a parse that skips that
check (`exact=False`) is told apart by `may_hold_big_integer`."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from trimflow._jsoncodec import loads, may_hold_big_integer

integers = st.one_of(st.integers(-(2**70), 2**70), st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1]))
# Strings with digit runs in them, where a scan for long integers could be fooled.
digit_text = st.builds(
    lambda a, n, b: f"{a}{n}{b}", st.sampled_from(["", "id ", ":", "[", ",", "-", "\n", '"x":']), integers, st.sampled_from(["", " ns", "]", "}"])
)
leaves = st.one_of(st.none(), st.booleans(), integers, st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8), digit_text)
values = st.recursive(
    leaves, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=4)), max_leaves=16
)
WRITERS = [
    lambda v: json.dumps(v, separators=(",", ":")),
    lambda v: json.dumps(v),
    lambda v: json.dumps(v, indent=3),
    lambda v: json.dumps(v, indent="\t", separators=(" ,\r\n", " :  ")),
]


def typed(value: Any) -> str:
    """The value as the standard library writes it: an integer and the float of it differ."""
    return json.dumps(value, sort_keys=False)


@settings(max_examples=200, deadline=None)
@given(values, st.sampled_from(range(len(WRITERS))))
def test_the_value_read_is_the_exact_one(value: Any, writer: int) -> None:
    body = WRITERS[writer](value).encode()
    parsed, _ = loads(body)
    assert typed(parsed) == typed(json.loads(body))


@settings(max_examples=200, deadline=None)
@given(values, st.sampled_from(range(len(WRITERS))))
def test_a_parse_that_skips_the_check_is_exact_unless_the_check_says_so(value: Any, writer: int) -> None:
    body = WRITERS[writer](value).encode()
    parsed, _ = loads(body, exact=False)
    if typed(parsed) != typed(json.loads(body)):
        assert may_hold_big_integer(body)
