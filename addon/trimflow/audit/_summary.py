"""The audit's summary: per conversation, growth per turn, the turn each limit is (or would be) crossed,
the failures the recording holds, and the provider's usage (cache reads and writes) with its cost at the
price table's rates; totals over all requests.

Growth is the steady rate: the least-squares slope of a figure over the last STEADY_TURNS turns of the
conversation (all of them when it has fewer). Pruning holds a body flat once it reaches its cap, so a fit
over the whole run mixes the turns before the cap with the flat ones after it and reports growth the
next turns will not have; the recent turns are what predicts the next ones. Five turns are enough for
the slope to read through one odd turn (a retry, a pruning step) and few enough that a cap reached five
turns ago reads as flat. The slope over the whole run is kept beside it, named as such.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .._prices import DEFAULT_PRICES_PATH, PriceTable, load_prices
from .._record import COUNT_TOKENS, ENFORCE, TURN, Record
from ._read import InputTally, Row

STEADY_TURNS = 5
GROWTH_METHOD = (
    f"steady rate: least-squares slope over the last {STEADY_TURNS} turns of each conversation "
    "(all of them when it has fewer); growth_per_turn_whole_run: the slope over all its turns"
)
UNKNOWN_CONVERSATION = "-"  # requests the engine could not read (not JSON): no conversation key
NOT_BILLED = (COUNT_TOKENS,)  # record kinds a provider does not charge for (Anthropic's token count is free)


@dataclass(frozen=True, slots=True)
class Crossing:
    """When a conversation crosses one limit: the first turn over it, as recorded or after pruning.

    `projected` means the recording stops before the crossing and `crossed_at` extends its growth.
    """

    limit: str  # max_images or max_body_bytes
    value: int
    source: str  # "rule NAME" (the rules file) or "profile NAME" (a limit profile)
    crossed_at: int | None
    projected: bool
    after_crossed_at: int | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "limit": self.limit,
            "value": self.value,
            "source": self.source,
            "crossed_at": self.crossed_at,
            "projected": self.projected,
            "after_crossed_at": self.after_crossed_at,
        }


@dataclass(frozen=True, slots=True)
class Failure:
    turn: int | None
    status: int | None
    category: str

    def to_dict(self) -> dict[str, Any]:
        return {"turn": self.turn, "status": self.status, "category": self.category}


@dataclass
class Totals:
    """The sums over a set of rows (a conversation's, the whole summary's): requests, bytes, tokens, images, usage, cost."""

    requests: int = 0
    body_bytes_before: int = 0
    body_bytes_after: int = 0
    est_tokens_before: int = 0
    est_tokens_after: int = 0
    images_before: int = 0
    images_after: int = 0
    pruned: int = 0
    # The provider's usage, over the billed requests whose answer reported it (*_reported: how many said
    # anything about the cache: OpenAI and Gemini never report a write).
    usage_requests: int = 0
    input_tokens: int = 0
    cache_read_tokens: int = 0
    cache_read_reported: int = 0
    cache_write_tokens: int = 0
    cache_write_reported: int = 0
    output_tokens: int = 0
    priced: int = 0  # billed requests with a cost
    priced_usd: float = 0.0
    without_usd: float = 0.0  # the priced requests as the agent sent them, without trimflow (estimated: WITHOUT_METHOD)
    unpriced: Counter[str] = field(default_factory=Counter)  # billed requests with no cost, by reason
    cache_breaks: Counter[str] = field(default_factory=Counter)  # turns whose cache read fell, by cause (Record.cache_break)
    recalls: int = 0  # images the run's recall_image brought back (docs/how-it-works.md#recall)
    recalls_refused: int = 0

    def add(self, row: Row) -> None:
        r = row.record
        self.requests += 1
        self.recalls += getattr(r, "recalls", 0) or 0  # getattr: older records lack it
        self.recalls_refused += getattr(r, "recalls_refused", 0) or 0
        self.body_bytes_before += r.body_bytes_before
        self.body_bytes_after += r.body_bytes_after
        self.est_tokens_before += r.est_tokens_before
        self.est_tokens_after += r.est_tokens_after
        self.images_before += r.images_before
        self.images_after += r.images_after
        self.pruned += r.pruned
        if r.kind in NOT_BILLED:
            return
        if r.cache_break is not None:
            self.cache_breaks[r.cache_break] += 1
        if r.usage_input_tokens is not None:
            self.usage_requests += 1
            self.input_tokens += r.usage_input_tokens
            self.output_tokens += r.usage_output_tokens or 0
        if r.usage_cache_read_tokens is not None:
            self.cache_read_tokens += r.usage_cache_read_tokens
            self.cache_read_reported += 1
        if r.usage_cache_write_tokens is not None:
            self.cache_write_tokens += r.usage_cache_write_tokens
            self.cache_write_reported += 1
        if row.cost is not None:
            self.priced += 1
            self.priced_usd += row.cost
            self.without_usd += row.cost_without if row.cost_without is not None else row.cost
        elif row.unpriced is not None:
            self.unpriced[row.unpriced] += 1

    @property
    def cost_usd(self) -> float | None:
        """USD of the priced requests; None when none could be priced (not 0: the cost is unknown)."""
        return self.priced_usd if self.priced else None

    @property
    def cost_without_usd(self) -> float | None:
        """USD the priced requests would have cost without trimflow (estimated); None when none could be priced."""
        return self.without_usd if self.priced else None

    @property
    def body_bytes_saved(self) -> int:
        return self.body_bytes_before - self.body_bytes_after

    @property
    def est_tokens_saved(self) -> int:
        return self.est_tokens_before - self.est_tokens_after

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "body_bytes_before": self.body_bytes_before,
            "body_bytes_after": self.body_bytes_after,
            "body_bytes_saved": self.body_bytes_saved,
            "est_tokens_before": self.est_tokens_before,
            "est_tokens_after": self.est_tokens_after,
            "est_tokens_saved": self.est_tokens_saved,
            "images_before": self.images_before,
            "images_after": self.images_after,
            "pruned": self.pruned,
            "usage_requests": self.usage_requests,
            "usage_input_tokens": self.input_tokens,
            "usage_cache_read_tokens": self.cache_read_tokens if self.cache_read_reported else None,
            "usage_cache_write_tokens": self.cache_write_tokens if self.cache_write_reported else None,
            "usage_output_tokens": self.output_tokens,
            "cost_usd": self.cost_usd,
            "cost_priced_requests": self.priced,
            "cost_unpriced_requests": dict(self.unpriced),  # reason -> requests: the cost leaves them out
            "cost_without_trimflow_usd": self.cost_without_usd,  # the same requests as sent by the agent: WITHOUT_METHOD
            "cache_breaks": dict(self.cache_breaks),  # cause -> turns whose cache read fell for it
            "recalls": self.recalls,
            "recalls_refused": self.recalls_refused,
        }


@dataclass
class Conversation:
    id: str
    rows: list[Row]  # in turn order
    totals: Totals = field(default_factory=Totals)
    # Per turn, keyed body_bytes, images, after.body_bytes and after.images: the steady rate (over the last
    # steady_turns turns) and the slope over the whole run.
    growth: dict[str, float | None] = field(default_factory=dict)
    growth_whole_run: dict[str, float | None] = field(default_factory=dict)
    steady_turns: int = 0  # how many turns the steady rate is fitted over
    crossings: list[Crossing] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)

    @property
    def has_after(self) -> bool:
        """Whether any request has after figures of its own (a what-if, or trimflow's record)."""
        return any(row.after is not None for row in self.rows)

    @property
    def numbered(self) -> list[Row]:
        """The rows with a turn number: token counts, warm-ups and unreadable bodies have none."""
        return [row for row in self.rows if row.record.turn is not None]

    @property
    def turns(self) -> int:
        """Requests that are turns (numbered or not), leaving out token counts and warm-ups."""
        return sum(1 for row in self.rows if row.record.kind == TURN)

    @property
    def last(self) -> Row:
        return self.rows[-1]

    @property
    def first_turn(self) -> int | None:
        numbered = self.numbered
        return numbered[0].record.turn if numbered else None

    @property
    def last_turn(self) -> int | None:
        numbered = self.numbered
        return numbered[-1].record.turn if numbered else None

    def models(self) -> list[str]:
        seen: dict[str, None] = {}
        for row in self.rows:
            seen.setdefault(row.record.model or row.record.format, None)
        return list(seen)

    def to_dict(self) -> dict[str, Any]:
        last = self.last
        return {
            "conversation": self.id,
            "host": last.record.host,
            "path": last.record.path,
            "format": last.record.format,
            "models": self.models(),
            "turns": self.turns,
            "first_turn": self.first_turn,
            "last_turn": self.last_turn,
            "limits_rule": last.limits_rule,
            "growth_per_turn": self.growth,
            "growth_per_turn_turns": self.steady_turns,
            "growth_per_turn_whole_run": self.growth_whole_run,
            "limits": [c.to_dict() for c in self.crossings],
            "failures": [f.to_dict() for f in self.failures],
            "totals": self.totals.to_dict(),
        }


EMPTY, CUT = "empty", "cut"


@dataclass(frozen=True, slots=True)
class InputProblem:
    """An input the figures cannot stand on: one with no LLM request (EMPTY), or one cut short (CUT)."""

    kind: str
    path: str
    text: str  # one line, naming the file


@dataclass
class Summary:
    inputs: list[InputTally]
    conversations: list[Conversation]
    totals: Totals
    rules_source: str | None  # the --rules file of a what-if, else None
    limits_source: str  # where the reference limits come from
    profiles: list[str] = field(default_factory=list)  # limit profiles whose crossings are reported too
    prices_source: str = "rules/prices.yaml"  # the price table the costs come from

    @property
    def what_if(self) -> bool:
        return self.rules_source is not None

    @property
    def flows(self) -> int:
        return sum(t.flows for t in self.inputs)

    @property
    def skipped(self) -> int:
        return sum(t.skipped for t in self.inputs)

    def unreadable(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for tally in self.inputs:
            for reason, n in tally.unreadable.items():
                out[reason] = out.get(reason, 0) + n
        return out

    def unread_answers(self) -> dict[str, int]:
        """Answers of measured requests that were not read (their usage is unknown), by reason."""
        out: dict[str, int] = {}
        for tally in self.inputs:
            for reason, n in tally.unread_answers.items():
                out[reason] = out.get(reason, 0) + n
        return out

    def input_problems(self) -> list[InputProblem]:
        problems = []
        for t in self.inputs:
            if t.truncated:
                problems.append(InputProblem(CUT, t.path, f"{t.path}: {t.truncated}"))
            elif not t.llm_requests:
                unit = "line" if t.kind == "jsonl" else "flow"
                held = f"{t.flows:,} {unit}{'s' if t.flows != 1 else ''}"
                unreadable = sum(t.unreadable.values())
                if t.skipped or unreadable:
                    held += f": {t.skipped:,} not LLM, {unreadable:,} unreadable"
                problems.append(InputProblem(EMPTY, t.path, f"{t.path}: no LLM request measured ({held}); did the client go through the proxy?"))
        return problems

    def rows(self) -> Iterable[Row]:
        for conversation in self.conversations:
            yield from conversation.rows

    def to_dict(self) -> dict[str, Any]:
        return {
            "inputs": [t.to_dict() for t in self.inputs],
            "flows": self.flows,
            "llm_requests": self.totals.requests,
            "skipped_not_llm": self.skipped,
            "unreadable": self.unreadable(),
            "unread_answers": self.unread_answers(),
            "what_if_rules": self.rules_source,
            "limits_source": self.limits_source,
            "profiles": self.profiles,
            "growth_method": GROWTH_METHOD,
            "steady_turns": STEADY_TURNS,
            "prices_source": self.prices_source,
            "cost_method": COST_METHOD,
            "cost_without_trimflow_method": WITHOUT_METHOD,
            "totals": self.totals.to_dict(),
            "conversations": [c.to_dict() for c in self.conversations],
        }


@dataclass(frozen=True, slots=True)
class ProfileLimits:
    """The limits of a limit profile (trimflow._limit_profiles) that the crossing report follows."""

    name: str
    max_images: int | None
    max_body_bytes: int | None


def summarize(
    rows: Iterable[Row],
    inputs: list[InputTally],
    rules_source: str | None,
    limits_source: str,
    profiles: Iterable[ProfileLimits] = (),
    prices: PriceTable | None = None,
) -> Summary:
    """`prices`: the table costs come from (None: the one shipped with trimflow, rules/prices.yaml)."""
    profiles = list(profiles)
    prices = load_prices() if prices is None else prices
    groups: dict[str, list[Row]] = {}
    totals = Totals()
    listed = list(rows)
    for row in listed:
        row.cost, row.unpriced = cost(row.record, prices)
        groups.setdefault(row.record.conversation or UNKNOWN_CONVERSATION, []).append(row)
    for group in groups.values():
        _costs_without(group, prices)
    for row in listed:
        totals.add(row)
    conversations = [_conversation(cid, group, profiles) for cid, group in groups.items()]
    shipped = prices.source == str(DEFAULT_PRICES_PATH)
    prices_source = f"{DEFAULT_PRICES_PATH.parent.name}/{DEFAULT_PRICES_PATH.name}" if shipped else prices.source
    return Summary(inputs, conversations, totals, rules_source, limits_source, [p.name for p in profiles], prices_source)


COST_METHOD = (
    "per request, at the price table's rates for its model: (prompt - cache read - cache write) x input + cache write x "
    "cache_write (the 5-minute rate) + cache read x cache_read + output x output; unknown when the model has no price "
    "or the answer reported no usage; token counts are not billed"
)


def cost(record: Record, prices: PriceTable) -> tuple[float | None, str | None]:
    """(USD, None) for a billed request the table prices; (None, why not) when it cannot; (None, None) when
    the request is not billed."""
    if record.kind in NOT_BILLED:
        return None, None
    if record.usage_input_tokens is None or record.usage_output_tokens is None:
        return None, "no usage reported"
    price = prices.for_model(record.model)
    if price is None:
        return None, f"no price for {record.model or record.format}"
    read = record.usage_cache_read_tokens or 0
    write = record.usage_cache_write_tokens or 0
    return price.cost(record.usage_input_tokens - read - write, write, read, record.usage_output_tokens), None


WITHOUT_METHOD = (
    "estimated from the records: each turn's prompt as the agent sent it is trimflow's token estimate of its body before "
    "pruning, scaled by what the provider counted over the estimate of what was sent; a prompt cache reads the "
    "conversation's previous turn whole (where the agent's own change, the cache's lifetime or a first turn broke the "
    "cache, what the provider read) and writes the rest, at the same prices; the output as reported"
)
_AGENTS_BREAKS = frozenset(("first_turn", "agent_prefix", "cache_expired"))  # would have broken the cache without trimflow too


def _costs_without(rows: list[Row], prices: PriceTable) -> None:
    """Each priced row's cost as the agent sent it (Row.cost_without: WITHOUT_METHOD), in turn order."""
    previous: int | None = None
    for row in sorted(rows, key=lambda row: row.record.turn or 0):
        r = row.record
        price = prices.for_model(r.model)
        if row.cost is None or price is None or r.usage_input_tokens is None or r.kind != TURN:
            continue
        if r.mode != ENFORCE:  # observe: forwarded as the agent sent it, so what it cost
            row.cost_without, previous = row.cost, r.usage_input_tokens
            continue
        sent = r.sent_est_tokens
        prompt = round(r.est_tokens_before * r.usage_input_tokens / sent) if sent else r.usage_input_tokens
        prompt = max(prompt, r.usage_input_tokens)  # trimflow never makes a prompt longer
        if r.usage_cache_read_tokens is None:  # a provider that reports no cache: none is modelled
            read = 0
        elif previous is None or r.cache_break in _AGENTS_BREAKS:
            read = min(r.usage_cache_read_tokens, prompt)
        else:
            read = min(previous, prompt)
        write = prompt - read if r.usage_cache_write_tokens is not None else 0  # OpenAI and Gemini bill no write
        row.cost_without = price.cost(prompt - read - write, write, read, r.usage_output_tokens or 0)
        previous = prompt


def _conversation(cid: str, rows: list[Row], profiles: list[ProfileLimits]) -> Conversation:
    rows.sort(key=lambda row: row.record.turn or 0)  # stable: JSONL lines come in finishing order
    conversation = Conversation(cid, rows)
    for row in rows:
        conversation.totals.add(row)
    numbered = conversation.numbered
    recent = numbered[-STEADY_TURNS:]
    conversation.steady_turns = len(recent)
    series: dict[str, Callable[[Row], float]] = {
        "body_bytes": lambda row: row.record.body_bytes_before,
        "images": lambda row: row.record.images_before,
        "after.body_bytes": lambda row: row.record.body_bytes_after,
        "after.images": lambda row: row.record.images_after,
    }
    for name, value in series.items():
        conversation.growth[name] = slope(_turns(recent), [value(row) for row in recent])
        conversation.growth_whole_run[name] = slope(_turns(numbered), [value(row) for row in numbered])
    last = rows[-1]
    sources = [(f"rule {last.limits_rule}", last)] + [(f"profile {p.name}", p) for p in profiles]
    for source, limits in sources:
        for limit, before, after in (
            ("max_images", lambda row: row.record.images_before, lambda row: row.record.images_after),
            ("max_body_bytes", lambda row: row.record.body_bytes_before, lambda row: row.record.body_bytes_after),
        ):
            value = getattr(limits, limit)
            if value is not None and numbered:
                conversation.crossings.append(_crossing(limit, value, source, numbered, before, after))
    conversation.failures = [Failure(row.record.turn, row.record.status, row.failure) for row in rows if row.failure]
    return conversation


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ys over xs; None with fewer than two distinct xs."""
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def _turns(rows: list[Row]) -> list[float]:
    return [float(row.record.turn or 0) for row in rows]


def _crossing(limit: str, value: int, source: str, rows: list[Row], before: Callable[[Row], int], after: Callable[[Row], int]) -> Crossing:
    recorded = next((row.record.turn for row in rows if before(row) > value), None)
    after_at = next((row.record.turn for row in rows if after(row) > value), None)
    if recorded is not None:
        return Crossing(limit, value, source, recorded, False, after_at)
    # Not crossed yet: extend the line fitted to the steady rate to the first whole turn above the limit.
    recent = rows[-STEADY_TURNS:]
    turns, ys = _turns(recent), [float(before(row)) for row in recent]
    b = slope(turns, ys)
    if b is None or b <= 0:
        return Crossing(limit, value, source, None, False, after_at)
    a = sum(ys) / len(ys) - b * sum(turns) / len(turns)
    projected = math.floor((value - a) / b) + 1
    last_turn = int(turns[-1])
    return Crossing(limit, value, source, max(projected, last_turn + 1), True, after_at)
