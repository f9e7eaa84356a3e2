"""What the cut takes first (trimflow._value): the images cut before, then a tool's output and the agent's screens by
arrival, the user's protected attachments last, never the newest; and a session of an agent working from a user's
mock-up in every format with the shipped rules, through the engine as the proxy runs it."""

from __future__ import annotations

import dataclasses
import itertools

import orjson
import pytest

from trimflow import prune, prune_request
from trimflow._conversation import Conversations
from trimflow._last_turns import LastTurns
from trimflow._limits import Limits
from trimflow._lookalike import THUMBNAILS
from trimflow._media import AGENT, IMAGE, TOOL, USER, Media
from trimflow._rules_file import DEFAULT_RULES_PATH, load_rules
from trimflow._value import cut_order
from trimflow.formats import FORMATS
from trimflow.testing import PATHS, b64
from trimflow.testing._screens import agent_session, app_screen, mockup, repeating_screens

from .bench import best_distinct
from .helpers import encode


def images(*origins: str) -> list[Media]:
    return [Media(IMAGE, ("messages", i), f"{i}" * 100, origin=origin) for i, origin in enumerate(origins)]


def test_the_users_images_older_than_a_screen_go_after_every_other_one_and_the_newest_last() -> None:
    shown = images(USER, TOOL, TOOL, AGENT, USER, TOOL)
    chosen = cut_order(shown, range(6), 0, Limits(max_images=8, prune_batch=6))
    assert chosen.order == (1, 2, 3, 0, 4, 5)
    assert chosen.protected == {3, 4}


def test_what_was_cut_before_stays_first_and_the_order_is_by_arrival_not_place() -> None:
    shown = images(TOOL, USER, TOOL, TOOL)
    # Arrived oldest first: image 2 (cut before), then 1 (the user's), 0, 3.
    chosen = cut_order(shown, (2, 1, 0, 3), 1, Limits(max_images=8, prune_batch=6))
    assert chosen.order == (2, 0, 1, 3) and chosen.protected == {2}


@pytest.mark.parametrize(
    ("origins", "expected"),
    [
        ((USER, USER, USER, USER), (0, 1, 2, 3)),  # a chat pasting screenshots: by age, as before
        ((TOOL, TOOL, USER, USER), (0, 1, 2, 3)),  # the user's newer than every screen: age keeps them
        ((USER, TOOL, TOOL, TOOL), (1, 2, 0, 3)),
    ],
)
def test_only_a_users_image_older_than_a_screen_needs_protecting(origins: tuple[str, ...], expected: tuple[int, ...]) -> None:
    assert cut_order(images(*origins), range(len(origins)), 0, Limits(max_images=8, prune_batch=6)).order == expected


def test_how_many_are_protected_is_a_rule_field_and_by_default_what_fits_beside_the_floor() -> None:
    shown = images(USER, USER, USER, USER, USER, USER, USER, TOOL, TOOL)
    assert Limits(max_images=8, prune_batch=6).user_images_protected() == 5  # 8 - a floor of 3
    assert Limits(max_images=8, low_water=0.4, max_images_after_overflow=5).user_images_protected() == 2  # 5 - 3
    assert Limits(max_images=10, low_water=0.5, max_images_after_overflow=8).user_images_protected() == 3
    assert Limits(max_images=8, prune_batch=1).user_images_protected() == 0  # rolling: the floor is the cap
    assert Limits().user_images_protected() is None  # no cap: every one
    chosen = cut_order(shown, range(9), 0, Limits(max_images=8, prune_batch=6))
    assert chosen.order == (0, 1, 7, 2, 3, 4, 5, 6, 8)  # the newest 5 of the user's go last
    two = cut_order(shown, range(9), 0, Limits(max_images=8, protect_user_images=2))
    assert two.order == (0, 1, 2, 3, 4, 7, 5, 6, 8) and two.protected == {6, 7}
    assert cut_order(shown, range(9), 0, Limits(max_images=8, protect_user_images=0)).order == tuple(range(9))


def test_a_cut_ahead_of_need_keeps_the_protected_and_a_cut_the_cap_needs_takes_them_last() -> None:
    """Five attachments, then screens: the low-water cut (3 of 8) keeps all five and the newest; a batch stops short of
    them; a cap of 4 takes the oldest two of them, and never the newest screen."""
    mock = [b64(mockup(k)) for k in range(5)]
    shots = [app_screen(k, (320, 200)) for k in range(1, 6)]
    contents = [{"role": "user", "parts": [{"text": "like these"}, *({"inline_data": {"mime_type": "image/png", "data": m}} for m in mock)]}]
    for shot in shots:
        screen = {"inline_data": {"mime_type": "image/png", "data": b64(shot)}}
        contents += [
            {"role": "model", "parts": [{"functionCall": {"name": "look", "args": {}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "look", "response": {}}}, screen]},
        ]
    url = f"https://api.example.test{PATHS['gemini']}"
    body = encode({"contents": contents})
    rules = load_rules(DEFAULT_RULES_PATH).with_limits(max_images=8, low_water=0.4, max_images_after_overflow=None)
    sent = _sent("gemini", prune_request(url, {}, body, rules).body)
    assert sent == [*mock, b64(shots[-1])]
    sent = _sent("gemini", prune_request(url, {}, body, rules.with_limits(max_images=4, low_water=None)).body)
    assert sent == [*mock[2:], b64(shots[-1])]
    # Batches of 6 without a low-water mark: one image over 8 cuts the three older screens, not three of the mock-ups.
    fewer = encode({"contents": contents[:-2]})
    sent = _sent("gemini", prune_request(url, {}, fewer, rules.with_limits(low_water=None, prune_batch=6)).body)
    assert sent == [*mock, b64(shots[-2])]


# --- an agent working from the user's mock-up, 30 turns under the shipped rules ---------------------------------

MODELS = {"anthropic": "claude-sonnet-4-6", "openai-chat": "gpt-4o", "openai-responses": "gpt-5", "gemini": "gemini-2.5-flash"}


def _sent(fmt: str, body: bytes) -> list[str]:
    """The base64 of each image the body sends, in document order."""
    found = FORMATS[fmt].find_media(orjson.loads(body))
    out = []
    for m in found:
        if m.kind == IMAGE and m.data is not None:
            out.append(m.data[m.data_offset :])
    return out


def run_session(fmt: str, protect: int | None, instances: int = 1) -> list[tuple[bool, bool, int, int]]:
    """Per turn: whether the mock-up went, whether the newest screenshot went, the images sent and the cap. With two
    `instances`, the turns alternate between two memories that share the conversations file, as behind a balancer."""
    rules = load_rules(DEFAULT_RULES_PATH)
    if protect is not None:
        rules = rules.with_limits(protect_user_images=protect)
    model = MODELS[fmt]
    path = PATHS[fmt] if fmt != "openai-responses" else "/v1/responses"
    url = f"https://api.example.test{path}"
    cap = rules.limits_for("api.example.test", path, model).max_images
    assert cap is not None
    first, shots = mockup(), [app_screen(k, (320, 200)) for k in range(1, 31)]
    shared = LastTurns(":memory:")
    memories = [Conversations(shared=shared) for _ in range(instances)]
    rows = []
    for turn, body in enumerate(agent_session(fmt, first, shots[:29], model), start=1):
        conversations = memories[turn % instances]
        outcome = prune_request(url, {}, encode(body), rules, memory=conversations)
        assert outcome.record is not None and outcome.history is not None
        conversations.assign(outcome.history, outcome.record.kind, outcome.cut)
        sent = _sent(fmt, outcome.body)
        newest = b64(shots[turn - 2]) if turn > 1 else b64(first)
        rows.append((b64(first) in sent, newest in sent, len(sent), cap))
    shared.close()
    assert len(rows) == 30
    return rows


@pytest.mark.parametrize("fmt", sorted(MODELS))
def test_the_users_mock_up_reaches_the_provider_on_every_turn_with_the_newest_screen_under_the_cap(fmt: str) -> None:
    rows = run_session(fmt, None)
    assert all(mock for mock, _, _, _ in rows)
    assert all(newest for _, newest, _, _ in rows)
    assert all(sent <= cap for _, _, sent, cap in rows)
    assert any(sent < turn for turn, (_, _, sent, _) in enumerate(rows, start=1))  # the cut did move
    off = run_session(fmt, 0)  # protection off: every image by age, the mock-up first to go
    assert not all(mock for mock, _, _, _ in off)
    assert all(newest for _, newest, _, _ in off) and all(sent <= cap for _, _, sent, cap in off)
    # As many images on every turn as by age alone: the cut moves on the same turns (the prompt cache breaks as often).
    assert [sent for _, _, sent, _ in rows] == [sent for _, _, sent, _ in off]


def test_two_instances_sharing_the_conversations_file_keep_the_mock_up_as_one_does() -> None:
    assert run_session("anthropic", None, instances=2) == run_session("anthropic", None)


def test_a_retry_within_a_limit_the_provider_named_keeps_the_mock_up_too() -> None:
    """Recovery prunes the refused request again under the limit the answer named (`tighten`), in the same order: a
    gateway's cap of 4 still sends the mock-up and the newest screen."""
    rules = load_rules(DEFAULT_RULES_PATH)
    first, shots = mockup(), [app_screen(k, (320, 200)) for k in range(1, 7)]
    body = encode(list(agent_session("anthropic", first, shots, "claude-sonnet-4-6"))[-1])
    target = rules.target("api.example.test", "/v1/messages")
    assert target is not None
    outcome = prune(target, {}, body, rules, tighten=lambda model, limits: dataclasses.replace(limits, max_images=4))
    sent = _sent("anthropic", outcome.body)
    assert len(sent) <= 4 and sent[0] == b64(first) and sent[-1] == b64(shots[-1])


# --- repeated screens before distinct ones --------------------------------------------------------------------------


def run_repeating(fmt: str, lookalikes: bool = True, instances: int = 1) -> tuple[list[dict], list[int]]:
    """36 screenshots, every third the screen before it with the cursor moved or the clock on, through the engine under
    the shipped rules as the proxy runs it. Per turn: what went (screens by number), what the cut took, the bodies."""
    rules = load_rules(DEFAULT_RULES_PATH).with_limits(cut_lookalikes=lookalikes)
    model = MODELS[fmt]
    path = PATHS[fmt] if fmt != "openai-responses" else "/v1/responses"
    url = f"https://api.example.test{path}"
    shots, screens = repeating_screens(36, (320, 200))
    screen_of = {b64(shot): screen for shot, screen in zip(shots, screens, strict=True)}
    shared = LastTurns(":memory:")
    memories = [Conversations(shared=shared) for _ in range(instances)]
    rows = []
    for turn, body in enumerate(agent_session(fmt, None, shots, model), start=1):
        conversations = memories[turn % instances]
        made = THUMBNAILS.made
        outcome = prune_request(url, {}, encode(body), rules, memory=conversations)
        assert outcome.record is not None and outcome.history is not None
        conversations.assign(outcome.history, outcome.record.kind, *outcome.taken)
        sent = _sent(fmt, outcome.body)
        rows.append(
            {
                "sent": [screen_of[s] for s in sent],
                "kept": [i for i in range(turn - 1) if i not in outcome.cut],
                "cut": set(outcome.cut),
                "like": set(outcome.like),
                "made": THUMBNAILS.made - made,
                "body": outcome.body,
            }
        )
    shared.close()
    return rows, screens


@pytest.mark.parametrize("fmt", sorted(MODELS))
def test_a_repeated_screen_is_cut_before_any_distinct_one_on_the_turns_the_cut_moves(fmt: str) -> None:
    rows, screens = run_repeating(fmt)
    today, _ = run_repeating(fmt, lookalikes=False)
    assert [len(r["sent"]) for r in rows] == [len(r["sent"]) for r in today]  # as many images on every turn
    moved = [turn for turn in range(1, len(rows)) if rows[turn]["cut"] - rows[turn - 1]["cut"]]
    assert moved == [turn for turn in range(1, len(today)) if today[turn]["cut"] - today[turn - 1]["cut"]]  # the same turns
    for turn, row in enumerate(rows):
        previous = rows[turn - 1] if turn else {"cut": set()}
        assert previous["cut"] <= row["cut"]  # a cut image stays cut
        if turn not in moved:
            assert row["made"] == 0 and row["cut"] == previous["cut"]  # no thumbnail made, nothing moves
        newly = row["cut"] - previous["cut"]
        kept = row["kept"]
        repeats_kept = [i for i in kept if i + 1 in kept and screens[i] == screens[i + 1]]
        distinct_newly_cut = [i for i in newly if not (i + 1 < len(screens) and screens[i] == screens[i + 1])]
        assert not (distinct_newly_cut and repeats_kept), (turn, distinct_newly_cut, repeats_kept)
        assert row["like"] == {i for i in row["cut"] if screens[i] == screens[i + 1]}
    distinct = [len(set(r["sent"])) for r in rows]
    before = [len(set(r["sent"])) for r in today]
    assert all(a >= b for a, b in zip(distinct, before, strict=True)) and sum(distinct) > sum(before)


def test_a_look_alikes_placeholder_names_the_image_after_it_and_keeps_its_text_on_later_turns() -> None:
    rows, _ = run_repeating("anthropic")
    last = orjson.loads(rows[-1]["body"])
    texts = [
        block["text"]
        for message in last["messages"]
        for part in message["content"]
        if part.get("type") == "tool_result"
        for block in part["content"]
        if block.get("type") == "text"
    ]
    like = sorted(rows[-1]["like"])
    assert like and all(f"[trimflow: image #{i + 1} omitted: the same screen as image #{i + 2}]" in texts for i in like)
    for turn in range(1, len(rows)):  # once written, a placeholder is the same on every later turn
        earlier, later = orjson.loads(rows[turn - 1]["body"])["messages"], orjson.loads(rows[turn]["body"])["messages"]
        assert [orjson.dumps(m) for m in later[: len(earlier) - 1]] == [orjson.dumps(m) for m in earlier[:-1]] or turn in {
            t for t in range(1, len(rows)) if rows[t]["cut"] - rows[t - 1]["cut"]
        }


def test_two_instances_sharing_the_conversations_file_cut_the_same_look_alikes_as_one() -> None:
    """The other instance has no memory of which cut image was a look-alike: its thumbnails say, and the same text goes."""
    one, _ = run_repeating("openai-chat")
    two, _ = run_repeating("openai-chat", instances=2)
    assert [r["body"] for r in two] == [r["body"] for r in one]


def test_the_benchs_bound_on_distinct_screens_is_what_every_schedule_reaches_at_best() -> None:
    """tests/bench.py's `best_distinct` (a search over the screens kept) against every schedule, image by image, on a
    small session: a cap of 4 cut to 2, every third screenshot the one before it again."""
    screens = [0, 1, 1, 2, 3, 3, 4, 5, 5, 6, 7, 7, 8]
    sizes, moved, kept = [0], set(), 0
    for turn in range(1, len(screens) + 1):
        kept += 1
        if kept > 4:
            kept, _ = 2, moved.add(turn)
        sizes.append(kept)

    def every(turn: int, sent: tuple[int, ...]) -> int:
        if turn == len(sizes):
            return 0
        new = turn - 1
        if turn not in moved:
            options = [(*sent, new)]
        else:
            options = [(*chosen, new) for chosen in itertools.combinations(sent, sizes[turn] - 1)]
        return max(len({screens[i] for i in option}) + every(turn + 1, option) for option in options)

    assert best_distinct(screens, sizes, moved) == pytest.approx(every(1, ()) / len(sizes))
