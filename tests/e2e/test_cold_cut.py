"""The cold cut through real mitmdumps: a conversation that has gone over its cap and is then idle past its cache's
lifetime (`cache_ttl`) is cut to the low-water mark at once, and later turns hold that cut. Two mitmdumps sharing one conversations file, each sent
every other turn (a round-robin balancer), cut the conversation as one mitmdump does; two that each keep their own
take the other's warm cache for a cold one.

The pause is the feature's own trigger, the wall clock passing the cache's lifetime: the test waits for that time
to pass since the last turn went, with a lifetime of CACHE_TTL seconds so that the turns sent back to back stay
well within it on a busy machine.
"""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from trimflow._last_turns import FILE_NAME
from trimflow.testing import PATHS, FakeProvider

from .helpers import Proxy, image_payloads, post, session, shots, start_all, stop_all

pytestmark = pytest.mark.e2e

CACHE_TTL = 5.0
CAP, BATCH, LOW_WATER = 8, 6, 0.4  # a moving cut leaves int(8 * 0.4) = 3 images
RULES = f"""defaults:
  max_images: {CAP}
  max_body_bytes: 16MiB
  keep_recent: 1
  prune_batch: {BATCH}
  low_water: {LOW_WATER}
  cache_ttl: {CACHE_TTL}s
"""
BEFORE_THE_PAUSE, AFTER_THE_PAUSE = range(1, 11), range(11, 13)  # turn k sends k screenshots: over the cap from turn 9


def test_a_pause_past_the_cache_lifetime_cuts_to_the_low_water_mark_once_across_instances_sharing_the_file(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    providers = {group: FakeProvider().start() for group in ("single", "pair", "apart")}
    files = {
        "single": [tmp_path / "single" / FILE_NAME],
        "pair": [tmp_path / "shared" / FILE_NAME] * 2,
        "apart": [tmp_path / "apart-a" / FILE_NAME, tmp_path / "apart-b" / FILE_NAME],
    }
    groups = {
        group: [
            Proxy(tmp_path / f"{group}-{i}", "--mode", f"reverse:{providers[group].url}", rules=rules, trimflow_conversations=str(path))
            for i, path in enumerate(paths)
        ]
        for group, paths in files.items()
    }
    start_all(*(p.mitm for proxies in groups.values() for p in proxies))
    images = shots(max(AFTER_THE_PAUSE), seed=61)
    try:

        def turn(k: int) -> None:
            """Turn k of one conversation through each group, to its instance k mod its size (round robin)."""
            body = orjson.dumps(session("anthropic", images[:k]))
            for proxies in groups.values():
                status, answer = post(proxies[k % len(proxies)].port, PATHS["anthropic"], body, {"content-type": "application/json"})
                assert status == 200, answer[:300]

        for k in BEFORE_THE_PAUSE:
            turn(k)
        # A real pause past the cache's lifetime: the idle time is what is under test, no event stands for it.
        time.sleep(CACHE_TTL + 0.5)
        for k in AFTER_THE_PAUSE:
            turn(k)

        sent = {group: [len(image_payloads("anthropic", r.json())) for r in provider.received] for group, provider in providers.items()}
        mark = int(CAP * LOW_WATER)
        # One instance: everything sent while within the cap; turn 9 over it, cut to the mark and held on turn 10; after
        # the pause the cold cut down to the mark, then held.
        assert sent["single"] == [*range(1, CAP + 1), mark, mark + 1, mark, mark + 1]
        # Cut ahead of any limit, for the cache: the cold cut on turn 11 takes two images more than the cap needs (6
        # of 11, in a batch of 6), and turn 12 holds it.
        (single,) = groups["single"]
        cold = [r for r in single.records_after(0, max(AFTER_THE_PAUSE)) if r["turn"] in AFTER_THE_PAUSE]
        assert [(r["turn"], r["images_after"], r["pruned_for_cache"]) for r in cold] == [(11, mark, 2), (12, mark + 1, 2)]
        # Two sharing the file: each turn goes to the instance that missed the one before, and cuts as one instance.
        assert sent["pair"] == sent["single"]
        assert [r.body for r in providers["pair"].received] == [r.body for r in providers["single"].received]
        # Each its own: the instance of turn 10 last saw turn 8, within the cap, and cuts to the mark again; the
        # instance of turn 12 last saw turn 10, before the pause, and cuts "cold" the cache turn 11 warmed.
        assert sent["apart"] == [*range(1, CAP + 1), mark, mark, mark, mark]
    finally:
        stop_all(*(p.mitm for proxies in groups.values() for p in proxies))
        for provider in providers.values():
            provider.stop()
