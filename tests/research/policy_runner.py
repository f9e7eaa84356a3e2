"""What each pruning policy costs on the reference sessions (tests.research.cache_sessions), against the prompt
cache model.

`run_policy` sends every turn of a session through the engine under one policy (a rules file with overrides),
in process, as one proxy remembers the conversation or as several behind a round-robin balancer do, then the
body the engine forwards through the cache model at the session's simulated time, and adds up what the
provider would bill. `scripts/replay --policies` prints the tables (`main`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from trimflow._conversation import Conversations
from trimflow._engine import prune
from trimflow._last_turns import LastTurns
from trimflow._limit_profiles import Profile, check, load_profiles
from trimflow._prices import Price, PriceTable, load_prices
from trimflow._rules import Rules
from trimflow._rules_file import DEFAULT_RULES_PATH, load_rules
from trimflow.formats import FORMATS, IMAGE
from trimflow.testing._cache_model import CacheModel, CacheUsage, TooManyBreakpoints, prompt_of

from .cache_sessions import REFERENCE_SESSIONS, ReferenceSession
from .optimum import Optimum, Ratios, optima, policy_floor, price_for, ratios, session_cap

__all__ = ["POLICIES", "Policy", "PolicyResult", "TurnResult", "main", "run_policy", "turn_images"]


# --- policies -------------------------------------------------------------------------------------------------

_OFF = {"low_water": None, "cache_ttl": None, "max_images_after_overflow": None}
# The card's caps for every model (8; 10 for Gemini, below): the policies compared with each other and with the shipped
# rules, which hold fewer images by model once a conversation has gone over its cap.
_CAP_8 = {"max_images": 8, "max_images_after_overflow": None}
_GEMINI_10 = {"gemini": {"max_images": 10}}
REQUEST_ONLY_RULES = DEFAULT_RULES_PATH.parent / "examples" / "request-only.yaml"
LEAN_RULES = DEFAULT_RULES_PATH.parent / "examples" / "lean.yaml"


@dataclass(frozen=True)
class Policy:
    """A way to prune: the shipped rules (or the rules file `path`) with `overrides` forced on the defaults and
    every rule (None: as the file has them), and for a session of a wire format in `by_format`, that format's
    overrides on top (a provider whose cache prices call for other settings)."""

    name: str
    overrides: Mapping[str, Any] | None
    by_format: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    path: Path | None = None

    def rules(self, base: Rules, fmt: str | None = None) -> Rules:
        if self.path is not None:
            base = load_rules(self.path)
        rules = base if self.overrides is None else base.with_limits(**self.overrides)
        extra = self.by_format.get(fmt) if fmt is not None else None
        return rules if extra is None else rules.with_limits(**extra)


POLICIES: tuple[Policy, ...] = (
    Policy("no pruning", {"max_images": None, "max_body_bytes": None, "max_est_tokens": None, **_OFF}),
    Policy("rolling (batch 1)", {**_CAP_8, "prune_batch": 1, **_OFF}, _GEMINI_10),
    Policy("batch 4", {**_CAP_8, "prune_batch": 4, **_OFF}, _GEMINI_10),
    Policy("batch 6", {**_CAP_8, "prune_batch": 6, **_OFF}, _GEMINI_10),
    Policy("batch 8", {**_CAP_8, "prune_batch": 8, **_OFF}, _GEMINI_10),
    Policy("low-water 0.5", {**_CAP_8, "prune_batch": 1, "low_water": 0.5, "cache_ttl": None}, _GEMINI_10),
    Policy("low-water 0.5 + cache_ttl 5m", {**_CAP_8, "prune_batch": 1, "low_water": 0.5, "cache_ttl": 300.0}, _GEMINI_10),
    # Batches of 6, and a conversation idle past the TTL cut to their floor at once: a low-water mark of 0.45
    # is 3 of 8 (batch 6's floor) and 4 of 10.
    Policy("batch 6 + cold cut", {**_CAP_8, "prune_batch": 6, "low_water": 0.45, "cache_ttl": 300.0}, _GEMINI_10),
    # The cold cut at each cap's batch-6 floor (3 of 8, 5 of 10), holding up to the cap after the first overflow on every
    # model: the shipped rules without their holds by model.
    Policy(
        "cold cut, card caps",
        {**_CAP_8, "prune_batch": 6, "low_water": 0.4, "cache_ttl": 300.0},
        {"gemini": {"max_images": 10, "low_water": 0.5}},
    ),
    # Voluntary caps from the first request on (rules/examples/lean.yaml): fewer images, below the card's caps.
    Policy("lean example", None, path=LEAN_RULES),
    # The shipped rules without the cold cut, every cut from the request alone: rules/examples/request-only.yaml.
    Policy("request-only example", None, path=REQUEST_ONLY_RULES),
    Policy("shipped defaults", None),
)


# --- the runner -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TurnResult:
    """One request as forwarded and billed: `broken` when it read less than the previous request left
    in a cache that was still warm; `breaches` the profiles the forwarded request breaks."""

    turn: int
    at: float  # simulated seconds since the session started
    images: int
    body_bytes: int
    usage: CacheUsage
    output_tokens: int
    cost: float | None
    broken: bool
    breaches: tuple[str, ...]


@dataclass
class PolicyResult:
    """What one session cost under one policy, turn by turn and summed."""

    session: str
    policy: str
    model: str
    turns: list[TurnResult]

    @property
    def requests(self) -> int:
        return len(self.turns)

    @property
    def images_sent(self) -> int:
        return sum(t.images for t in self.turns)

    @property
    def input_tokens(self) -> int:
        return sum(t.usage.prompt_tokens for t in self.turns)

    @property
    def cache_write_tokens(self) -> int:
        return sum(t.usage.cache_write_tokens for t in self.turns)

    @property
    def cache_read_tokens(self) -> int:
        return sum(t.usage.cache_read_tokens for t in self.turns)

    @property
    def uncached_tokens(self) -> int:
        return sum(t.usage.uncached_tokens for t in self.turns)

    @property
    def cost(self) -> float | None:
        costs = [t.cost for t in self.turns]
        return None if any(c is None for c in costs) else sum(c for c in costs if c is not None)

    @property
    def broken_turns(self) -> int:
        return sum(t.broken for t in self.turns)

    @property
    def breaches(self) -> dict[str, int]:
        """Turns that break each profile."""
        out: dict[str, int] = {}
        for t in self.turns:
            for name in t.breaches:
                out[name] = out.get(name, 0) + 1
        return out

    def summary(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "policy": self.policy,
            "model": self.model,
            "requests": self.requests,
            "images_sent": self.images_sent,
            "input_tokens": self.input_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "uncached_tokens": self.uncached_tokens,
            "cost_usd": None if self.cost is None else round(self.cost, 4),
            "broken_prefix_turns": self.broken_turns,
            "limits_breached": self.breaches,
        }


def turn_images(session: ReferenceSession) -> list[int]:
    """The images each turn of `session` holds as the agent sends it, before any cut."""
    module = FORMATS[session.fmt]
    return [sum(1 for m in module.find_media(orjson.loads(t.body)) if m.kind == IMAGE) for t in session.turns()]


REFUSED = "cache_control over 4"  # a breach: the provider refuses a fifth breakpoint


def run_policy(
    session: ReferenceSession,
    policy: Policy,
    *,
    base: Rules | None = None,
    prices: PriceTable | None = None,
    profiles: Sequence[Profile] | None = None,
    instances: int = 1,
    shared: bool = True,
) -> PolicyResult:
    """Every turn of `session` through the engine under `policy`, then through the cache model at the
    session's simulated time. The conversations are remembered as the proxy remembers them, on the same clock;
    with `instances` above 1, as that many proxies behind a round-robin balancer remember them: each its own
    memory, turn k going to instance k mod `instances`, one provider cache for all. `shared`: the instances share
    one file of last turns (trimflow._last_turns), as the proxies on one host do by default; False, each only
    its own memory."""
    if instances < 1:
        raise ValueError(f"instances must be at least 1, got {instances}")
    rules = policy.rules(base if base is not None else load_rules(DEFAULT_RULES_PATH), session.fmt)
    price = (prices if prices is not None else load_prices()).for_model(session.model)
    if profiles is None:
        known = load_profiles()
        profiles = [known.get(name) for name in session.profiles]
    now = 0.0
    cache = CacheModel(lambda: now)
    last_turns = LastTurns(":memory:", clock=lambda: now) if shared else None
    memories = [Conversations(clock=lambda: now, shared=last_turns) for _ in range(instances)]
    module = FORMATS[session.fmt]
    target = rules.target(session.host, session.path)
    if target is None:
        raise ValueError(f"{session.name}: {session.host}{session.path} is not an LLM request under these rules")
    headers = {"host": session.host, "content-type": "application/json"}
    results: list[TurnResult] = []
    warm: tuple[float, int] | None = None  # (expiry, tokens) of the prefix the previous request left cached
    try:
        for number, turn in enumerate(session.turns(), start=1):
            now += turn.think
            conversations = memories[(number - 1) % instances]
            outcome = prune(target, headers, turn.body, rules, memory=conversations)
            record, history = outcome.record, outcome.history
            if record is not None and history is not None:
                conversations.assign(history, record.kind, *outcome.taken)
            body = outcome.body
            parsed = orjson.loads(body)
            media = module.find_media(parsed)
            breaches = [v.profile for p in profiles if (v := check(p, body, media, model=session.model, parsed=parsed)) is not None]
            prompt = prompt_of(session.fmt, session.path, parsed, media)
            try:
                usage = cache.use(prompt) if prompt is not None else CacheUsage(0)
            except TooManyBreakpoints:
                usage, breaches = CacheUsage(0), [*breaches, REFUSED]
            broken = warm is not None and now < warm[0] and usage.cache_read_tokens < warm[1]
            warm = (now + usage.stored_ttl, usage.stored_tokens) if usage.stored_tokens else None
            cost = None if price is None else price.cost(usage.uncached_tokens, usage.cache_write_tokens, usage.cache_read_tokens, turn.output_tokens)
            images = sum(1 for m in media if m.kind == IMAGE)
            results.append(TurnResult(number, now, images, len(body), usage, turn.output_tokens, cost, broken, tuple(breaches)))
    finally:
        if last_turns is not None:
            last_turns.close()
    return PolicyResult(session.name, policy.name, session.model, results)


# --- the table ------------------------------------------------------------------------------------------------

_COLUMNS = (
    "policy",
    "requests",
    "images sent",
    "input tokens",
    "cache-write",
    "cache-read",
    "cost",
    "floor",
    "x optimum",
    "x optimum, by length",
    "broken-prefix turns",
    "limits breached",
)


def table(
    session: ReferenceSession,
    results: Sequence[PolicyResult],
    floors: Mapping[str, int],
    best: Mapping[int, Optimum],
    against: Mapping[str, Ratios],
    price: Price,
) -> str:
    """One session's results as a Markdown table (readable as text too), with each policy's floor and its cost
    over the optimum's at that floor (`against`, by policy name, priced with `price`) at full length and
    averaged over the lengths."""
    rows = [_COLUMNS]
    for r in results:
        cost = "-" if r.cost is None else f"${r.cost:,.2f}"
        breached = ", ".join(f"{name} x{n}" for name, n in r.breaches.items()) or "none"
        rows.append(
            (
                r.policy,
                f"{r.requests}",
                f"{r.images_sent:,}",
                f"{r.input_tokens:,}",
                f"{r.cache_write_tokens:,}",
                f"{r.cache_read_tokens:,}",
                cost,
                f"{floors[r.policy]}",
                f"{against[r.policy].full:.3f}",
                f"{against[r.policy].averaged:.3f}",
                f"{r.broken_turns}",
                breached,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    numeric = set(range(1, 11))

    def line(row: Sequence[str]) -> str:
        cells = [cell.rjust(widths[i]) if i in numeric else cell.ljust(widths[i]) for i, cell in enumerate(row)]
        return "| " + " | ".join(cells) + " |"

    rule = "|" + "|".join("-" * (w + 1) + (":" if i in numeric else "-") for i, w in enumerate(widths)) + "|"
    title = f"{session.name} ({session.model}): {session.description}"
    cap = next(iter(best.values())).cap
    each = "; ".join(f"floor {f}: {_dollars(o.cost)}, the cut moved on {o.moves} turns" for f, o in sorted(best.items()))
    cheapest = f"Optimum under a cap of {cap} images, by floor (the fewest images a policy sends after a cut): {each}."
    if any(r.cost is None for r in results):
        cheapest += f" Ratios priced as {price.family}."
    return "\n".join([title, "", line(rows[0]), rule, *(line(row) for row in rows[1:]), "", cheapest])


def _dollars(cost: float) -> str:
    return f"${cost:,.2f}" if cost >= 0.1 else f"${cost:,.4f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="replay --policies",
        description="Run the reference sessions through each pruning policy in process, against a model of the "
        "providers' prompt caching, and print per session and policy: requests, images sent, input tokens, "
        "cache-write and cache-read tokens, cost, the policy's floor (the fewest images it sends after a cut) and "
        "its cost over the cheapest cut schedule at that floor (at full length, and averaged over the session's "
        "lengths), turns whose cached prefix broke, and limits breached.",
    )
    parser.add_argument("--policies", action="store_true", required=True, help="this mode (the other replay options do not apply)")
    parser.add_argument("--session", action="append", choices=[s.name for s in REFERENCE_SESSIONS], help="only this session (repeatable)")
    parser.add_argument("--policy", action="append", choices=[p.name for p in POLICIES], help="only this policy (repeatable)")
    parser.add_argument("--json", action="store_true", help="print one JSON array of summaries instead of tables")
    args = parser.parse_args(argv)
    sessions = [s for s in REFERENCE_SESSIONS if not args.session or s.name in args.session]
    policies = [p for p in POLICIES if not args.policy or p.name in args.policy]
    base, prices = load_rules(DEFAULT_RULES_PATH), load_prices()
    summaries: list[dict[str, Any]] = []
    for n, session in enumerate(sessions):
        results = []
        for policy in policies:
            print(f"replay: {session.name}: {policy.name}", file=sys.stderr, flush=True)
            results.append(run_policy(session, policy, base=base, prices=prices))
        print(f"replay: {session.name}: the cheapest schedules", file=sys.stderr, flush=True)
        images = turn_images(session)
        cap = session_cap(session, base)
        floors = {r.policy: policy_floor(r, images, cap) for r in results}
        best = optima(session, floors.values(), base=base, prices=prices)
        price = price_for(session, prices)
        against = {r.policy: ratios(r, best[floors[r.policy]], price) for r in results}
        if args.json:
            for r in results:
                summary = r.summary()
                summary.update(
                    optimum_floor=floors[r.policy],
                    optimum_cost=round(best[floors[r.policy]].cost, 4),
                    cost_vs_optimum=round(against[r.policy].full, 4),
                    cost_vs_optimum_by_length=round(against[r.policy].averaged, 4),
                    turns_over_cap=against[r.policy].cap_broken,
                )
                summaries.append(summary)
        else:
            print(("\n" if n else "") + table(session, results, floors, best, against, price), flush=True)
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(summaries, option=orjson.OPT_INDENT_2) + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
