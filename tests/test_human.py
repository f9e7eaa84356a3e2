import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trimflow._human import format_duration, format_size, format_size_change, format_thousands, parse_duration, parse_size

KiB, MiB, GiB, TiB = 1024, 1024**2, 1024**3, 1024**4


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1024", 1024),
        (1024, 1024),
        (0, 0),
        ("0", 0),
        ("512B", 512),
        ("512 b", 512),
        ("2k", 2 * KiB),
        ("2K", 2 * KiB),
        ("2KB", 2 * KiB),
        ("2kb", 2 * KiB),
        ("2KiB", 2 * KiB),
        ("16m", 16 * MiB),
        ("16MB", 16 * MiB),  # binary, like mitmproxy: 1 MB = 1 MiB
        ("16MiB", 16 * MiB),
        ("16 MiB", 16 * MiB),
        ("  16mib  ", 16 * MiB),
        ("1g", GiB),
        ("1 GB", GiB),
        ("1GiB", GiB),
        ("2t", 2 * TiB),
        ("2TiB", 2 * TiB),
        ("1.5m", 3 * MiB // 2),
        ("1.5 MiB", 3 * MiB // 2),
        (".5k", 512),
        ("1.1k", 1126),  # fractional bytes round down
        ("2000000", 2_000_000),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", [None, "none", "None", "NULL", " null "])
def test_parse_size_none_means_no_limit(text):
    assert parse_size(text) is None


@pytest.mark.parametrize("text", ["12x", "", " ", "k", "MiB", "1 2k", "1ib", "1e3", "1kk", "16 MiBs", "0x10", "1,000", "one"])
def test_parse_size_rejects_garbage(text):
    with pytest.raises(ValueError, match=r"use bytes or a k/m/g, KB/MB/GB or KiB/MiB/GiB suffix"):
        parse_size(text)


def test_parse_size_message_names_the_input():
    with pytest.raises(ValueError) as e:
        parse_size("12x")
    assert str(e.value) == "invalid size '12x': use bytes or a k/m/g, KB/MB/GB or KiB/MiB/GiB suffix"


@pytest.mark.parametrize("text", [-1, "-1", "-2m", " -0"])
def test_parse_size_rejects_negatives(text):
    with pytest.raises(ValueError, match="negative"):
        parse_size(text)


@pytest.mark.parametrize("text", ["1.5", "1.5B"])
def test_parse_size_rejects_fractional_bytes(text):
    with pytest.raises(ValueError, match="whole number"):
        parse_size(text)


@pytest.mark.parametrize("value", [True, False, 1.5, 2.0, [1], {"a": 1}])
def test_parse_size_rejects_other_types(value):
    # bool is an int subclass: YAML `yes` must not become 1 byte.
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(value)


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (0, "0B"),
        (512, "512B"),
        (1023, "1023B"),
        (1024, "1KB"),
        (685_000, "669KB"),  # a 502 KB WebP screenshot as base64
        (1023 * KiB, "1023KB"),
        (MiB - 100, "1.0MB"),  # would round to 1024KB
        (MiB, "1.0MB"),
        (9_856_614, "9.4MB"),
        (int(99.94 * MiB), "99.9MB"),
        (int(99.96 * MiB), "100MB"),  # 1 decimal only below 100
        (16 * MiB, "16.0MB"),
        (123 * MiB, "123MB"),
        (1023 * MiB, "1023MB"),
        (GiB - 1, "1.0GB"),
        (int(1.2 * GiB), "1.2GB"),
        (300 * GiB, "300GB"),
        (5 * TiB, "5.0TB"),
        (-2048, "-2KB"),
    ],
)
def test_format_size(n, expected):
    assert format_size(n) == expected


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        (562 * KiB, 450 * KiB, "562->450 KB"),  # one unit: said once
        (int(9.4 * MiB), 450 * KiB, "9.4 MB->450 KB"),
        (800, 600, "800->600 B"),
        (2 * MiB, 2 * MiB, "2.0->2.0 MB"),
    ],
)
def test_format_size_change(before, after, expected):
    assert format_size_change(before, after) == expected


_SHORT = re.compile(r"\d+B|\d+KB|\d+(\.\d)?(MB|GB|TB)")


@given(st.integers(min_value=0, max_value=2 * TiB))
def test_format_parse_round_trip(n):
    text = format_size(n)
    assert _SHORT.fullmatch(text), text
    back = parse_size(text)
    assert back is not None
    # Within the rounding of the printed figure: half a KB, or 5% once shown in MB and up.
    assert abs(back - n) <= max(512, n // 20) + 1
    # Printing the parsed figure again gives the same text (the figure is stable in logs).
    assert format_size(back) == text


@given(
    st.integers(min_value=0, max_value=10**6),
    st.sampled_from(["", "b", "k", "KB", "KiB", "m", "MB", "MiB", "g", "GB", "GiB", "t", "TB", "TiB"]),
    st.sampled_from(["", " "]),
)
def test_parse_size_units(number, unit, space):
    power = {"": 0, "b": 0, "k": 1, "m": 2, "g": 3, "t": 4}[unit[:1].lower()]
    assert parse_size(f"{number}{space}{unit}") == number * 1024**power


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        (300, 300.0),
        (1.5, 1.5),
        ("300", 300.0),
        ("90s", 90.0),
        ("5m", 300.0),
        ("5 M", 300.0),
        ("1h", 3600.0),
        ("0.5h", 1800.0),
        (None, None),
        ("null", None),
    ],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5x", "m", "5mm", "-5m", "1e3", True, [5]])
def test_parse_duration_rejects_garbage(text):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(("seconds", "shown"), [(7 * 86400 - 30, "6d 23h"), (3 * 3600 + 12 * 60 + 5, "3h 12m"), (59, "0h 0m"), (-5, "0h 0m")])
def test_format_duration(seconds, shown):
    assert format_duration(seconds) == shown


@pytest.mark.parametrize(("n", "expected"), [(0, "0"), (999, "999"), (1000, "1k"), (1499, "1k"), (120_400, "120k"), (2_500_000, "2500k")])
def test_format_thousands(n: int, expected: str) -> None:
    assert format_thousands(n) == expected
