"""The cheapest cut schedule of a reference session, and each policy's cost as a ratio to it.

A schedule says, for each turn, how many of the oldest images go as placeholders (the cut). It is
feasible when the cut never moves back, every request sends at most `cap` images, and every request
sends at least the newest `floor` images (all of them while it has fewer): the floor is what a policy
promises to keep, so the optimum at a policy's floor is the cheapest any policy keeping as much could be.
Batches of 6 under a cap of 8 send at least 3 images after a cut (cap - 5), 5 under a cap of 10.

Why a dynamic program over (turn, cut) is exact for the cache model (trimflow.testing._cache_model): the
sessions only append, and cuts only grow, so what a request can read from the cache is decided by the
request before it alone. Under the same cut, the previous request is the longest prefix cached (an older
one is a prefix of it, and was refreshed when it was read); under a larger cut, every earlier request
differs from this one at the oldest image the new cut takes, so only what precedes it (the system prompt,
the tools) is read, and that was refreshed by the previous request too. A turn's cost is therefore the
cost of its request in a cache that saw only the previous request, `think` seconds before:
tests/testing/test_optimum.py checks this against exhaustive search with the real model on small sessions.

Each request under each cut is the one the engine forwards (trimflow._engine.prune with `max_images` set
to leave exactly that cut), so the placeholders are the shipped ones, byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson

from trimflow._engine import prune
from trimflow._limit_profiles import load_profiles
from trimflow._prices import Price, PriceTable, load_prices
from trimflow._rules import Rules
from trimflow._rules_file import DEFAULT_RULES_PATH, load_rules
from trimflow.formats import FORMATS, IMAGE
from trimflow.testing._cache_model import CacheModel, CacheUsage, Prompt, prompt_of

if TYPE_CHECKING:  # the policy runner prints these ratios: it imports this module
    from .cache_sessions import ReferenceSession
    from .policy_runner import PolicyResult

__all__ = [
    "BATCH_FLOOR_BELOW_CAP",
    "RATIO_PRICES",
    "CutTurn",
    "Optimum",
    "Ratios",
    "batch_floor",
    "cheapest",
    "cut_requests",
    "feasible_cuts",
    "optima",
    "optimum",
    "policy_floor",
    "price_for",
    "priced_optima",
    "ratios",
    "schedule_cost",
    "session_cap",
    "simulate",
]

# Batches of 6 cut from cap + 1 images down to cap - 5: the floor the optimum is computed at by default.
BATCH_FLOOR_BELOW_CAP = 5

# Prices for the ratios of a model rules/prices.yaml leaves out (a ratio needs some price; the tables show
# such a session's dollars as "-"). Gemini 2.5 Flash: input $0.30 and output $2.50 per million tokens as
# Google's pricing page gives them, implicit-cache reads at a 75% discount (a 90% one is also reported).
RATIO_PRICES: dict[str, Price] = {
    "gemini-2.5-flash": Price(
        "gemini-2.5-flash (ratios only)", 0.30, 0.30, 0.075, 2.50, "https://ai.google.dev/gemini-api/docs/pricing", "2026-11-24"
    ),
}


def batch_floor(cap: int) -> int:
    """The fewest images batches of 6 send once a cap of `cap` has made them cut (at least one)."""
    return max(1, cap - BATCH_FLOOR_BELOW_CAP)


def price_for(session: ReferenceSession, prices: PriceTable | None = None) -> Price:
    """The price the ratios of `session` use: rules/prices.yaml's, else RATIO_PRICES'."""
    price = (prices if prices is not None else load_prices()).for_model(session.model)
    if price is None:
        price = RATIO_PRICES.get(session.model)
    if price is None:
        raise ValueError(f"{session.name}: no price for {session.model}, in rules/prices.yaml or RATIO_PRICES")
    return price


@dataclass(frozen=True)
class CutTurn:
    """One turn of a session with the request the engine forwards under each cut it is given."""

    images: int  # in the request as the agent sends it
    think: float
    output_tokens: int
    prompts: dict[int, Prompt]  # cut -> the request the engine forwards with that cut, as the cache sees it


@dataclass(frozen=True)
class Optimum:
    """The cheapest feasible schedule of a session: its cut at each turn, and the cheapest cost of every
    prefix of the session (`prefix_costs[k]`: of the first k + 1 turns, the session ending there)."""

    session: str
    cap: int
    floor: int
    images: tuple[int, ...]  # per turn, before any cut
    cuts: tuple[int, ...]
    turn_costs: tuple[float, ...]  # of the full-length schedule
    prefix_costs: tuple[float, ...]

    @property
    def cost(self) -> float:
        return self.prefix_costs[-1]

    @property
    def moves(self) -> int:
        """Turns on which the optimum moves its cut."""
        return sum(1 for a, b in zip((0, *self.cuts), self.cuts, strict=False) if b != a)


def session_cap(session: ReferenceSession, rules: Rules) -> int:
    """The most images a request of `session` may send: the tightest count its limit profiles set (what a
    gateway or provider refuses), else the rules' max_images. A rule's cap below the profiles' is a choice
    of the policy, not a limit: the optimum is free to send more, up to what is refused."""
    known = load_profiles()
    counts = [c for name in session.profiles if (c := known.get(name).max_images) is not None]
    cap = min(counts) if counts else rules.limits_for(session.host, session.path, session.model).max_images
    if cap is None:
        raise ValueError(f"{session.name}: no limit profile or rule sets max_images for {session.model}")
    return cap


def feasible_cuts(images: int, cap: int, floor: int, *, overflowed: bool = True) -> range:
    """The cuts a turn sending `images` may have: at most `cap` left, at least `floor` (or all); none before the
    conversation's first overflow (`overflowed`: this turn or an earlier one has more than `cap`)."""
    if not overflowed and images <= cap:
        return range(1)
    return range(max(0, images - cap), images - min(images, floor) + 1)


def _overflow_tracker(cap: int, free: bool) -> Callable[[int], bool]:
    """Called with each turn's images in order: whether the conversation has gone over `cap` by then (always, when
    `free`: the unconstrained schedule may cut before)."""
    seen = [free]

    def overflowed(images: int) -> bool:
        seen[0] = seen[0] or images > cap
        return seen[0]

    return overflowed


def cut_requests(session: ReferenceSession, rules: Rules, cuts_of: Callable[[int, int], Iterable[int]]) -> list[CutTurn]:
    """Every turn of `session` with the request the engine forwards under each cut `cuts_of(turn index, images)`."""
    target = rules.target(session.host, session.path)
    if target is None:
        raise ValueError(f"{session.name}: {session.host}{session.path} is not an LLM request under these rules")
    module = FORMATS[session.fmt]
    headers = {"host": session.host, "content-type": "application/json"}
    by_keep: dict[int, Rules] = {}
    out: list[CutTurn] = []
    for number, turn in enumerate(session.turns()):
        images = sum(1 for m in module.find_media(orjson.loads(turn.body)) if m.kind == IMAGE)
        prompts: dict[int, Prompt] = {}
        for cut in cuts_of(number, images):
            keep = images - cut
            if keep not in by_keep:
                by_keep[keep] = rules.with_limits(max_images=keep, prune_batch=1, low_water=None, cache_ttl=None, max_images_after_overflow=None)
            body = prune(target, headers, turn.body, by_keep[keep]).body
            parsed = orjson.loads(body)
            media = module.find_media(parsed)
            sent = sum(1 for m in media if m.kind == IMAGE)
            if sent != keep:
                raise ValueError(f"{session.name}: the engine sent {sent} images for a cut leaving {keep} (another limit cut)")
            prompt = prompt_of(session.fmt, session.path, parsed, media)
            if prompt is None:
                raise ValueError(f"{session.name}: {session.model} caches nothing under the cache model")
            prompts[cut] = prompt
        out.append(CutTurn(images, turn.think, turn.output_tokens, prompts))
    return out


def _after(previous: Prompt | None, prompt: Prompt, think: float) -> CacheUsage:
    """What `prompt` reads and writes in a cache that saw only `previous`, `think` seconds before."""
    clock = [0.0]
    cache = CacheModel(lambda: clock[0])
    if previous is not None:
        cache.use(previous)
    clock[0] = think
    return cache.use(prompt)


def _priced(price: Price, usage: CacheUsage, output_tokens: int) -> float:
    return price.cost(usage.uncached_tokens, usage.cache_write_tokens, usage.cache_read_tokens, output_tokens)


def optimum(
    session: ReferenceSession,
    *,
    base: Rules | None = None,
    prices: PriceTable | None = None,
    cap: int | None = None,
    floor: int | None = None,
    cut_before_overflow: bool = False,
) -> Optimum:
    """The cheapest schedule of `session` under the cache model, at its price (price_for). `cap`: session_cap
    unless given; `floor`: batch_floor(cap) unless given. No cut before the first turn over the cap, as
    trimflow's rules promise, unless `cut_before_overflow`."""
    price = price_for(session, prices)
    return priced_optima(session, {"": price}, base=base, cap=cap, floor=floor, cut_before_overflow=cut_before_overflow)[""]


def priced_optima(
    session: ReferenceSession,
    prices: Mapping[str, Price],
    *,
    base: Rules | None = None,
    cap: int | None = None,
    floor: int | None = None,
    cut_before_overflow: bool = False,
) -> dict[str, Optimum]:
    """`optimum` of `session` at each price of `prices` (by name): the requests of every cut are built once."""
    rules = base if base is not None else load_rules(DEFAULT_RULES_PATH)
    most = session_cap(session, rules) if cap is None else cap
    least = batch_floor(most) if floor is None else floor
    if not 1 <= least <= most:
        raise ValueError(f"a floor of {least} images under a cap of {most}")
    overflowed = _overflow_tracker(most, cut_before_overflow)
    turns = cut_requests(session, rules, lambda number, images: feasible_cuts(images, most, least, overflowed=overflowed(images)))
    return {name: cheapest(session.name, turns, price, most, least) for name, price in prices.items()}


def optima(
    session: ReferenceSession,
    floors: Iterable[int],
    *,
    base: Rules | None = None,
    prices: PriceTable | None = None,
    cut_before_overflow: bool = False,
) -> dict[int, Optimum]:
    """The cheapest schedule of `session` under its cap (session_cap) at each of `floors` (each kept within 1
    and the cap), with no cut before the first overflow unless `cut_before_overflow`: the requests of every cut
    are built once, for the lowest floor."""
    rules = base if base is not None else load_rules(DEFAULT_RULES_PATH)
    cap = session_cap(session, rules)
    wanted = sorted({min(max(1, f), cap) for f in floors})
    if not wanted:
        return {}
    price = price_for(session, prices)
    overflowed = _overflow_tracker(cap, cut_before_overflow)
    turns = cut_requests(session, rules, lambda number, images: feasible_cuts(images, cap, wanted[0], overflowed=overflowed(images)))
    return {floor: cheapest(session.name, [_within(t, cap, floor) for t in turns], price, cap, floor) for floor in wanted}


def _within(turn: CutTurn, cap: int, floor: int) -> CutTurn:
    """`turn` with the prompts of the cuts a floor of `floor` allows (the turn's own may exclude more: before the
    first overflow, only no cut)."""
    allowed = feasible_cuts(turn.images, cap, floor)
    return CutTurn(turn.images, turn.think, turn.output_tokens, {c: p for c, p in turn.prompts.items() if c in allowed})


def policy_floor(result: PolicyResult, images: Sequence[int], cap: int) -> int:
    """The fewest images `result` sent on a turn it cut (`images`: each turn's before any cut), within 1 and
    `cap`: the floor its optimum is computed at. A policy that never cut is held to the cap."""
    sent = [t.images for t, before in zip(result.turns, images, strict=True) if t.images < before]
    return min(max(1, min(sent, default=cap)), cap)


def cheapest(name: str, turns: Sequence[CutTurn], price: Price, cap: int, floor: int) -> Optimum:
    """The dynamic program over (turn, cut) on turns whose prompts are those of every feasible cut."""
    best: dict[int, float] = {}  # cut at the current turn -> cheapest cost of the turns so far ending with it
    back: list[dict[int, tuple[int, float]]] = []  # per turn: cut -> (previous turn's cut, this turn's cost)
    prefix_costs: list[float] = []
    previous: CutTurn | None = None
    for turn in turns:
        step_best: dict[int, float] = {}
        step_back: dict[int, tuple[int, float]] = {}
        for cut, prompt in turn.prompts.items():
            if previous is None:
                cost = _priced(price, _after(None, prompt, turn.think), turn.output_tokens)
                step_best[cut], step_back[cut] = cost, (-1, cost)
                continue
            for before, total in best.items():
                if before > cut:
                    continue  # a cut never moves back
                cost = _priced(price, _after(previous.prompts[before], prompt, turn.think), turn.output_tokens)
                if cut not in step_best or total + cost < step_best[cut]:
                    step_best[cut], step_back[cut] = total + cost, (before, cost)
        best, previous = step_best, turn
        back.append(step_back)
        prefix_costs.append(min(best.values()))
    cut = min(best, key=lambda c: best[c])
    cuts: list[int] = []
    costs: list[float] = []
    for step_back in reversed(back):
        cuts.append(cut)
        cut, cost = step_back[cut]
        costs.append(cost)
    return Optimum(name, cap, floor, tuple(t.images for t in turns), tuple(reversed(cuts)), tuple(reversed(costs)), tuple(prefix_costs))


def simulate(turns: Sequence[CutTurn], cuts: Sequence[int], price: Price) -> list[float]:
    """Each turn's cost when the turns are sent with `cuts`, through one cache model on the session's clock
    (no cap or floor enforced): the plain simulation the dynamic program's shortcut must agree with."""
    if len(turns) != len(cuts):
        raise ValueError(f"{len(cuts)} cuts for {len(turns)} turns")
    clock = [0.0]
    cache = CacheModel(lambda: clock[0])
    out: list[float] = []
    for turn, cut in zip(turns, cuts, strict=True):
        clock[0] += turn.think
        out.append(_priced(price, cache.use(turn.prompts[cut]), turn.output_tokens))
    return out


def schedule_cost(session: ReferenceSession, cuts: Sequence[int], *, base: Rules | None = None, prices: PriceTable | None = None) -> list[float]:
    """`simulate` for `session` sent with `cuts`."""
    rules = base if base is not None else load_rules(DEFAULT_RULES_PATH)
    turns = cut_requests(session, rules, lambda number, images: cuts[number : number + 1])
    return simulate(turns, cuts, price_for(session, prices))


@dataclass(frozen=True)
class Ratios:
    """A policy's cost over the optimum's at the same floor: at full length, and averaged over every length
    at which a schedule has a choice (the request has more images than the floor); `cap_broken`: turns
    sending more than the cap."""

    full: float
    averaged: float
    cap_broken: int
    floor_broken: int = 0  # turns that cut below the floor (fewer than the floor, or than all the images)


def ratios(result: PolicyResult, best: Optimum, price: Price) -> Ratios:
    """`result` (run_policy on the same session) priced with `price`, against `best`."""
    if len(result.turns) != len(best.prefix_costs):
        raise ValueError(f"{result.session}: {len(result.turns)} turns against an optimum of {len(best.prefix_costs)}")
    total = 0.0
    averaged: list[float] = []
    full = 1.0
    for turn, images, cheapest in zip(result.turns, best.images, best.prefix_costs, strict=True):
        total += _priced(price, turn.usage, turn.output_tokens)
        full = total / cheapest
        if images > best.floor:
            averaged.append(full)
    broken = sum(1 for t in result.turns if t.images > best.cap)
    below = sum(1 for t, images in zip(result.turns, best.images, strict=True) if t.images < min(images, best.floor))
    return Ratios(full, sum(averaged) / len(averaged) if averaged else 1.0, broken, below)
