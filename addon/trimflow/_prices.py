"""Token prices per model family, to turn a record's usage into dollars. Pure Python, no mitmproxy.

The table is a YAML file (rules/prices.yaml ships with trimflow; `--prices FILE` reads another) read with
_yaml's line-aware reader, so every problem names the file and line. Each entry names a model family, the
globs it matches (whole model name, case aside, first entry that matches wins, as a rule's `match.model`)
and its prices in USD per million tokens, with the page they come from and the date they were read.
A model no entry matches has no price: its cost is unknown (None), never a guess.
"""

from __future__ import annotations

import datetime
import fnmatch
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from yaml.nodes import Node

from ._yaml import NodeReader, line_of, read_text, shipped_file
from .errors import RulesError

DEFAULT_PRICES_PATH: Path = shipped_file("prices.yaml")

_TOP_KEYS = ("prices",)
_RATE_KEYS = ("input", "cache_write", "cache_write_1h", "cache_read", "output")
_ENTRY_KEYS = ("family", "match", "source", "as_of", *_RATE_KEYS, "long_prompt")
_LONG_KEYS = ("above_tokens", *_RATE_KEYS)
_PER = 1_000_000


@dataclass(frozen=True, slots=True)
class LongPrompt:
    """The rates a provider charges instead when the prompt (uncached + cache write + cache read) is
    longer than `above_tokens`, on every token of that request, output included."""

    above_tokens: int
    input: float
    cache_write: float
    cache_read: float
    output: float
    cache_write_1h: float | None = None


@dataclass(frozen=True, slots=True)
class Price:
    """One model family's prices in USD per million tokens.

    `cache_write` is the 5-minute cache write (Anthropic's default); providers with no write premium
    (OpenAI, Gemini) have it equal to `input`. `cache_write_1h` is the 1-hour write where it exists.
    """

    family: str
    input: float
    cache_write: float
    cache_read: float
    output: float
    source: str
    as_of: str  # ISO date the prices were read from `source`
    cache_write_1h: float | None = None
    long_prompt: LongPrompt | None = None

    def cost(self, uncached_input: int, cache_write: int, cache_read: int, output: int) -> float:
        """USD for one request. `uncached_input` is the prompt tokens neither read from nor written to
        the cache (for a record: usage_input_tokens - cache read - cache write). Cache writes are
        priced at the 5-minute rate: a response does not say which TTL a write used."""
        rates: Price | LongPrompt = self
        long = self.long_prompt
        if long is not None and uncached_input + cache_write + cache_read > long.above_tokens:
            rates = long
        return (max(uncached_input, 0) * rates.input + cache_write * rates.cache_write + cache_read * rates.cache_read + output * rates.output) / _PER


class _Rates(NamedTuple):
    input: float
    cache_write: float
    cache_read: float
    output: float
    cache_write_1h: float | None


@dataclass(frozen=True, slots=True)
class _Entry:
    price: Price
    globs: tuple[str, ...]
    pattern: re.Pattern[str]


class PriceTable:
    """The entries of one prices file, in file order."""

    def __init__(self, entries: Sequence[_Entry], source: str = "<string>") -> None:
        self._entries = tuple(entries)
        self.source = source

    @property
    def prices(self) -> tuple[Price, ...]:
        return tuple(e.price for e in self._entries)

    def for_model(self, model: str | None) -> Price | None:
        """The first entry whose globs match the whole model name (case aside); None for no match or no model."""
        if not model:
            return None
        for entry in self._entries:
            if entry.pattern.match(model):
                return entry.price
        return None

    def __len__(self) -> int:
        return len(self._entries)


def load_prices(path: str | os.PathLike[str] | None = None) -> PriceTable:
    """Read a prices file (None: the one shipped with trimflow); any problem is a RulesError naming the file and line."""
    path = DEFAULT_PRICES_PATH if path is None else path
    return parse_prices(read_text(path, RulesError), os.fspath(path))


def parse_prices(text: str, source: str = "<string>") -> PriceTable:
    return _PricesReader(source).parse(text)


def _compile(globs: Sequence[str]) -> re.Pattern[str]:
    return re.compile("|".join(fnmatch.translate(g) for g in globs), re.IGNORECASE)


class _PricesReader(NodeReader[PriceTable]):
    """Reads a prices file; _yaml.NodeReader walks the YAML and makes the file:line errors."""

    error_class = RulesError

    def top(self, root: Node | None) -> PriceTable:
        empty = "empty prices file: write `prices:` with at least one entry (see rules/prices.yaml)"
        top = self.top_mapping(root, "the prices file", _TOP_KEYS, empty)
        assert root is not None  # top_mapping refuses an empty file
        if "prices" not in top:
            raise self.error(root, "no `prices:` section")
        entries: list[_Entry] = []
        families: dict[str, int] = {}
        for node in self.sequence(top["prices"][1], "`prices`"):
            entry = self._entry(node)
            family = entry.price.family
            if family in families:
                raise self.error(node, f"family {family!r} is listed twice (first on line {families[family]})")
            families[family] = line_of(node)
            entries.append(entry)
        if not entries:
            raise self.error(top["prices"][1], "`prices` has no entry")
        return PriceTable(entries, self.source)

    def _entry(self, node: Node) -> _Entry:
        fields = self.mapping(node, "a price entry")
        self.reject_unknown(fields, _ENTRY_KEYS, "a price entry")
        for key in ("family", "match", "source", "as_of", "input", "cache_read", "output"):
            if key not in fields:
                raise self.error(node, f"price entry has no `{key}`")
        family = self._text(fields["family"][1], "family")
        globs = self._globs(fields["match"][1])
        source = self._text(fields["source"][1], "source")
        if not source.startswith(("https://", "http://")):
            raise self.error(fields["source"][1], f"`source` must be the pricing page's URL, got {source!r}")
        as_of = self._date(fields["as_of"][1])
        r = self._rates(fields)
        long_prompt = self._long_prompt(fields["long_prompt"][1], family) if "long_prompt" in fields else None
        price = Price(family, r.input, r.cache_write, r.cache_read, r.output, source, as_of, r.cache_write_1h, long_prompt)
        return _Entry(price, globs, _compile(globs))

    def _rates(self, fields: dict[str, tuple[Node, Node]]) -> _Rates:
        rate = {key: self._rate(fields[key][1], key) for key in _RATE_KEYS if key in fields}
        # No write premium (OpenAI, Gemini): a prompt written to the cache is billed as input.
        write = rate.get("cache_write", rate["input"])
        return _Rates(rate["input"], write, rate["cache_read"], rate["output"], rate.get("cache_write_1h"))

    def _long_prompt(self, node: Node, family: str) -> LongPrompt:
        fields = self.mapping(node, f"`long_prompt` of family {family!r}")
        self.reject_unknown(fields, _LONG_KEYS, "`long_prompt`")
        for key in ("above_tokens", "input", "cache_read", "output"):
            if key not in fields:
                raise self.error(node, f"`long_prompt` has no `{key}`")
        above_node = fields["above_tokens"][1]
        above = self.scalar(above_node)
        if isinstance(above, bool) or not isinstance(above, int) or above <= 0:
            raise self.error(above_node, f"`above_tokens` must be a positive whole number, got {self.describe(above_node)}")
        r = self._rates(fields)
        return LongPrompt(above, r.input, r.cache_write, r.cache_read, r.output, r.cache_write_1h)

    def _rate(self, node: Node, key: str) -> float:
        value = self.scalar(node)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != value:
            raise self.error(node, f"`{key}` must be a price in USD per million tokens (a number >= 0), got {self.describe(node)}")
        return float(value)

    def _text(self, node: Node, key: str) -> str:
        value = self.scalar(node)
        if not isinstance(value, str) or not value.strip():
            raise self.error(node, f"`{key}` must be text, got {self.describe(node)}")
        return value.strip()

    def _date(self, node: Node) -> str:
        value = self.scalar(node)
        if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
            return value.isoformat()
        if isinstance(value, str):
            try:
                return datetime.date.fromisoformat(value.strip()).isoformat()
            except ValueError:
                pass
        raise self.error(node, f"`as_of` must be a date written YYYY-MM-DD, got {self.describe(node)}")

    def _globs(self, node: Node) -> tuple[str, ...]:
        items = self.sequence(node, "`match`") if not self._is_text(node) else [node]
        globs = tuple(self._text(item, "match") for item in items)
        if not globs:
            raise self.error(node, "`match` must list at least one model name glob")
        return globs

    def _is_text(self, node: Node) -> bool:
        return isinstance(self.scalar(node), str)
