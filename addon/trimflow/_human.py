"""Human figures: byte sizes (parse "16MiB" / "2m" / "1.5 GB", print "9.4MB"), durations ("5m", "90s", "1h") and
counts in thousands ("120k").

All units are binary (1 KB = 1 KiB = 1024 bytes), as in mitmproxy's own size options, so a
figure means the same thing in a rules file, on the mitmproxy command line and in our logs.
"""

from __future__ import annotations

import re
from decimal import Decimal

_UNITS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}
# number, optional space, then nothing, "b", or k/m/g/t optionally followed by "b" or "ib".
_SIZE_RE = re.compile(r"(\d+(?:\.\d+)?|\.\d+)\s*(?:([kmgt])(?:i?b)?|b)?", re.IGNORECASE)
_HINT = "use bytes or a k/m/g, KB/MB/GB or KiB/MiB/GiB suffix"


def parse_size(text: str | int | None) -> int | None:
    """Return the size in bytes, or None for None / "none" / "null" (no limit).

    Decimal figures with a unit round down to whole bytes ("1.1k" is 1126).
    Raises ValueError for anything else, negatives included.
    """
    if text is None:
        return None
    if isinstance(text, bool) or not isinstance(text, (int, str)):
        # bool is an int subclass: "max_body_bytes: yes" must not mean 1 byte.
        raise ValueError(f"invalid size {text!r}: {_HINT}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"invalid size {text}: must not be negative")
        return text
    s = text.strip()
    if s.lower() in ("none", "null"):
        return None
    if s.startswith("-"):
        raise ValueError(f"invalid size {text!r}: must not be negative")
    m = _SIZE_RE.fullmatch(s)
    if m is None:
        raise ValueError(f"invalid size {text!r}: {_HINT}")
    number, unit = m.group(1), (m.group(2) or "").lower()
    value = Decimal(number) * (1024 ** _UNITS[unit])
    if value != value.to_integral_value():
        if not unit:
            raise ValueError(f"invalid size {text!r}: a byte count must be a whole number")
    return int(value)  # truncates toward zero; value >= 0


_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|d)?", re.IGNORECASE)
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str | int | float | None) -> float | None:
    """Return the duration in seconds ("5m" is 300, "7d" a week, a bare number is seconds), or None for None / "none" / "null".

    Raises ValueError for anything else, negatives included.
    """
    if text is None:
        return None
    if isinstance(text, bool) or not isinstance(text, (int, float, str)):
        raise ValueError(f"invalid duration {text!r}: use seconds or an s/m/h/d suffix, like 5m")
    if not isinstance(text, str):
        if text < 0:
            raise ValueError(f"invalid duration {text}: must not be negative")
        return float(text)
    s = text.strip()
    if s.lower() in ("none", "null"):
        return None
    m = _DURATION_RE.fullmatch(s)
    if m is None:
        raise ValueError(f"invalid duration {text!r}: use seconds or an s/m/h/d suffix, like 5m")
    return float(m.group(1)) * _SECONDS[(m.group(2) or "").lower()]


def format_duration(seconds: float) -> str:
    """A time left, to the hour past a day and to the minute below one: "6d 23h", "3h 12m"."""
    whole = max(0, int(seconds))
    days, rest = divmod(whole, 86400)
    return f"{days}d {rest // 3600}h" if days else f"{rest // 3600}h {rest % 3600 // 60}m"


def format_thousands(n: int) -> str:
    """A count (of tokens) in short form: 999, 1k, 120k."""
    return f"{n / 1000:.0f}k" if n >= 1000 else str(n)


def format_size(n: int) -> str:
    """Short binary figure for logs and placeholders: 512B, 669KB, 9.4MB, 123MB, 1.2GB."""
    return "".join(_figure(n))


def format_size_change(before: int, after: int) -> str:
    """Two sizes in short form, the unit said once when they share it: "562->450 KB", "9.4 MB->450 KB"."""
    (first, first_unit), (second, second_unit) = _figure(before), _figure(after)
    if first_unit == second_unit:
        return f"{first}->{second} {first_unit}"
    return f"{first} {first_unit}->{second} {second_unit}"


def _figure(n: int) -> tuple[str, str]:
    """The number and unit of format_size."""
    if n < 0:
        number, unit = _figure(-n)
        return "-" + number, unit
    if n < 1024:
        return str(n), "B"
    kb = round(n / 1024)
    if kb < 1024:  # rounding 1023.6 KB up would print "1024KB": fall through to MB instead
        return str(kb), "KB"
    value = n / 1024**2
    for unit in ("MB", "GB", "TB"):
        if round(value, 1) < 100:
            return f"{value:.1f}", unit
        if round(value) < 1024 or unit == "TB":
            return f"{value:.0f}", unit
        value /= 1024
    raise AssertionError("unreachable")
