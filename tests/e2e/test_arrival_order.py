"""An image's age is when it first came, end to end: an aider-like session (every image the user added re-sent in
one early user message, in an order that changes on every request, one image more each turn, and a system prompt
whose time changes too) by the real openai client, through a real mitmdump with the addon, to the FakeProvider.
Over 12 turns with a cap of 8, on every request the provider gets the image just added byte for byte, never more
than 8 images, and never an image the proxy cut on an earlier request."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import openai
import pytest

from trimflow.testing import FakeProvider, data_url

from ..images import reshuffled_chat
from .helpers import OPENAI_KEY, PLACEHOLDER_MARK, Proxy, direct_http_client, image_payloads, shots, start_all, stop_all

pytestmark = pytest.mark.e2e

TURNS = 12
CAP = 8
POLICIES = {
    "shipped": None,  # the shipped rules' cap for gpt-4o
    "rolling": f"defaults:\n  max_images: {CAP}\n  prune_batch: 1\n",
    "low_water": f"defaults:\n  max_images: {CAP}\n  low_water: 0.5\n",
    # Rules that let every image through, and an upstream that refuses more than 8 (the generic-8 profile played in
    # the proxy): the cap comes from the retry, which must cut by arrival as the prune does.
    "recovered": "defaults:\n  max_images: 20\n",
}
OPTIONS = {"recovered": {"trimflow_simulate": "generic-8", "trimflow_retries": "4"}}
# The order of each turn's images: with seed 7 the image just added sits first on turn 9, the first one refused,
# so a retry that cut by position would cut it.
SEEDS = {"recovered": 7}


@pytest.fixture(scope="module")
def proxies(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Proxy, FakeProvider]]]:
    """One proxy per policy, each in front of a provider of its own, started side by side."""
    out: dict[str, tuple[Proxy, FakeProvider]] = {}
    with contextlib.ExitStack() as stack:
        for name, text in POLICIES.items():
            provider = stack.enter_context(FakeProvider())
            workdir = tmp_path_factory.mktemp(name)
            rules = None
            if text is not None:
                rules = workdir / "rules.yaml"
                rules.write_text(text)
            out[name] = (Proxy(workdir, "--mode", f"reverse:{provider.url}", rules=rules, **OPTIONS.get(name, {})), provider)
        start_all(*(proxy.mitm for proxy, _ in out.values()))
        yield out
        stop_all(*(proxy.mitm for proxy, _ in out.values()))


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_the_newest_image_by_arrival_goes_byte_identical_and_a_cut_one_never_comes_back(
    proxies: dict[str, tuple[Proxy, FakeProvider]], policy: str
) -> None:
    proxy, provider = proxies[policy]
    provider.clear()
    images = shots(TURNS, seed=26, width=96, height=64)
    cut: set[bytes] = set()
    with (
        proxy.expect_records(TURNS) as records,
        openai.OpenAI(api_key=OPENAI_KEY, base_url=f"{proxy.url}/v1", http_client=direct_http_client(), max_retries=0, timeout=30) as client,
    ):
        for turn in range(1, TURNS + 1):
            added = images[:turn]
            body = reshuffled_chat([data_url(shot, "image/png") for shot in added], turn, seed=SEEDS.get(policy, 3))
            reply = client.chat.completions.create(model=body["model"], messages=body["messages"])
            assert reply.choices[0].message.content
            received = provider.received[-1]
            went = image_payloads("openai-chat", received.json())
            assert len(provider.received) == turn
            assert len(went) <= CAP and received.body.count(PLACEHOLDER_MARK) == turn - len(went), turn
            assert policy != "rolling" or len(went) == min(turn, CAP)
            assert added[-1] in went, f"turn {turn}: the image just added was cut"
            assert not cut & set(went), f"turn {turn}: an image cut before came back"
            cut |= set(added) - set(went)
    assert len(cut) == TURNS - len(went)
    sent = [len(image_payloads("openai-chat", request.json())) for request in provider.received]
    assert [(r["images_before"], r["images_after"]) for r in records] == list(zip(range(1, TURNS + 1), sent, strict=True))
    assert all(r["status"] == 200 and r["reason"] is None for r in records)
    # Every request rewrites the early history (the time, the images' message): still one conversation, turns 1..N.
    assert [r["turn"] for r in records] == list(range(1, TURNS + 1)) and len({r["conversation"] for r in records}) == 1
