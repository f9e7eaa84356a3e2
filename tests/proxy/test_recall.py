"""trimflow.proxy.recall: the recall addon in the whole chain. With a run's token in the environment, the images a
request's placeholders name are kept (after the request went) and each placeholder names its id, the same on every
turn; without a token or with trimflow_recall empty, placeholders never offer recall and nothing is kept; a folder
that cannot be written costs recall only (one line), never a request; the record counts the run's recalls; bad
options stop mitmproxy with one line. The store itself: tests/test_recall.py."""

from __future__ import annotations

import base64
import logging
import os
import re
from pathlib import Path

import orjson
import pytest
from mitmproxy import exceptions
from mitmproxy.test import taddons

from trimflow import proxy
from trimflow._recall import TOKEN_VARIABLE, RecallError, RecallReader, image_id, run_folder

from ..helpers import TrimflowAddons, requested, wait_for
from ..images import chat_with_images
from .flows import llm_flow, write_rules

TOKEN = bytes(range(32))
AUTH = {"authorization": "Bearer sk-test-recall"}
RECALL = re.compile(r'\[trimflow: image #(\d+) omitted \([^)]*\); recall_image\("([a-z2-7]{10})"\) brings it back\]')


def chat_flow(images: int = 12, headers: dict | None = None):
    return llm_flow(body=orjson.dumps(chat_with_images(images)), headers=headers if headers is not None else AUTH)


def placeholders(flow) -> list[str]:
    messages = orjson.loads(flow.request.get_content())["messages"]
    return [p["text"] for m in messages if isinstance(m["content"], list) for p in m["content"] if p.get("text", "").startswith("[trimflow:")]


def sent_images(flow) -> list[bytes]:
    """The images of the request as the client sent them, oldest first."""
    messages = orjson.loads(flow.request.get_content())["messages"]
    return [
        base64.b64decode(p["image_url"]["url"].split(",", 1)[1])
        for m in messages
        if isinstance(m["content"], list)
        for p in m["content"]
        if p.get("type") == "image_url"
    ]


async def run_turn(instance: TrimflowAddons, flow) -> None:
    instance.requestheaders(flow)
    await requested(instance, flow)


async def test_with_a_token_each_cut_image_is_kept_and_its_placeholder_names_it_the_same_every_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_VARIABLE, TOKEN.hex())
    instance = TrimflowAddons()
    with taddons.context(instance) as tctx:
        tctx.configure(instance, trimflow_rules=str(write_rules(tmp_path / "rules.yaml", 3)), confdir=str(tmp_path / "confdir"))
        store = instance.flows.recall
        assert store is not None and store.folder == str(tmp_path / "confdir" / "trimflow-recall")
        originals = sent_images(chat_flow())
        first = chat_flow()
        await run_turn(instance, first)
        texts = placeholders(first)
        found = [RECALL.fullmatch(text) for text in texts]
        assert len(texts) == 9 and all(found)
        ids = [m.group(2) for m in found if m]
        assert ids == [image_id(raw) for raw in originals[:9]]
        wait_for(lambda: store.stored == 9, "the writer")
        reader = RecallReader(store.folder, TOKEN)
        assert [reader.read(i).data for i in ids] == originals[:9]

        again = chat_flow()
        await run_turn(instance, again)
        assert placeholders(again) == texts  # byte for byte: the provider's cached prefix survives
        assert store.flush() and store.stored == 9  # known images are used again, not written again
        instance.done()


async def test_credentials_other_than_the_runs_get_no_recall(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_VARIABLE, TOKEN.hex())
    instance = TrimflowAddons()
    with taddons.context(instance) as tctx:
        tctx.configure(instance, trimflow_rules=str(write_rules(tmp_path / "rules.yaml", 3)), confdir=str(tmp_path))
        ours, theirs = chat_flow(), chat_flow(headers={"authorization": "Bearer sk-someone-else"})
        await run_turn(instance, ours)
        await run_turn(instance, theirs)
        assert all(RECALL.fullmatch(t) for t in placeholders(ours))
        assert placeholders(theirs) and not any("recall_image" in t for t in placeholders(theirs))
        instance.done()


@pytest.mark.parametrize("setting", ["no token", "folder empty", "token not hex"])
async def test_without_recall_placeholders_never_offer_it_and_nothing_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str, caplog: pytest.LogCaptureFixture
) -> None:
    if setting == "no token":
        monkeypatch.delenv(TOKEN_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(TOKEN_VARIABLE, "zz" if setting == "token not hex" else TOKEN.hex())
    instance = TrimflowAddons()
    with taddons.context(instance) as tctx:
        options = {"trimflow_recall": ""} if setting == "folder empty" else {}
        tctx.configure(instance, trimflow_rules=str(write_rules(tmp_path / "rules.yaml", 3)), confdir=str(tmp_path), **options)
        assert instance.flows.recall is None
        flow = chat_flow()
        await run_turn(instance, flow)
        texts = placeholders(flow)
        assert len(texts) == 9 and not any("recall" in t for t in texts)
        assert not (tmp_path / "trimflow-recall").exists()
        if setting == "token not hex":
            assert [r.getMessage() for r in caplog.records if "recall" in r.getMessage()] == [
                f"trimflow: recall off: {TOKEN_VARIABLE} is not a run's token (hex, 16 bytes or more)"
            ]
        instance.done()


async def test_a_folder_that_cannot_be_made_costs_recall_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(TOKEN_VARIABLE, TOKEN.hex())
    (tmp_path / "a-file").write_text("")
    instance = TrimflowAddons()
    with taddons.context(instance) as tctx, caplog.at_level(logging.INFO):
        tctx.configure(instance, trimflow_rules=str(write_rules(tmp_path / "rules.yaml", 3)), trimflow_recall=str(tmp_path / "a-file" / "store"))
        store = instance.flows.recall
        assert store is not None
        first = chat_flow()
        await run_turn(instance, first)
        assert first.metadata[proxy.META]["images_after"] == 3  # pruned and forwarded all the same
        wait_for(lambda: store.failed is not None, "the writer's failure")
        later = chat_flow()
        await run_turn(instance, later)
        assert later.metadata[proxy.META]["images_after"] == 3
        assert placeholders(later) and not any("recall" in t for t in placeholders(later))  # no longer offered
        await run_turn(instance, chat_flow())
        (line,) = [r.getMessage() for r in caplog.records if "recall off" in r.getMessage()]  # one line, however many requests
        assert line.endswith(f" in {tmp_path / 'a-file' / 'store'}; placeholders no longer offer recall_image")
        instance.done()


async def test_the_record_counts_the_recalls_the_runs_server_answered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_VARIABLE, TOKEN.hex())
    instance = TrimflowAddons()
    with taddons.context(instance) as tctx:
        tctx.configure(instance, trimflow_rules=str(write_rules(tmp_path / "rules.yaml", 3)), confdir=str(tmp_path))
        store = instance.flows.recall
        assert store is not None
        first = chat_flow()
        await run_turn(instance, first)
        assert store.flush()
        reader = RecallReader(store.folder, TOKEN)
        ids = [m.group(2) for m in map(RECALL.fullmatch, placeholders(first)) if m]
        reader.read(ids[0])
        reader.read(ids[1])
        with pytest.raises(RecallError):
            reader.read("aaaaaaaaaa")
        second = chat_flow()
        await run_turn(instance, second)
        record = second.metadata[proxy.META]
        assert (record["recalls"], record["recalls_refused"]) == (2, 1)
        assert first.metadata[proxy.META]["recalls"] == 0
        instance.done()


def test_bad_recall_options_stop_with_one_line(tmp_path: Path) -> None:
    instance = proxy.Recall(proxy.SharedState())
    with taddons.context(instance) as tctx:
        for name, value, said in (
            ("trimflow_recall_size", "lots", "invalid size 'lots'"),
            ("trimflow_recall_conversation_size", "0", "need a value above 0"),
            ("trimflow_recall_lifetime", "90d", "at most 30d"),
        ):
            with pytest.raises(exceptions.OptionsError, match=said):
                tctx.configure(instance, **{name: value})
        options = tctx.options
        assert options.trimflow_recall == "{confdir}/trimflow-recall"
        assert (options.trimflow_recall_lifetime, options.trimflow_recall_size) == ("24h", "1.0GB")
        assert all(options._options[name].help for name in proxy.recall.OPTIONS if name != "confdir")


def test_the_run_folder_name_gives_nothing_of_the_token() -> None:
    assert TOKEN.hex() not in run_folder(TOKEN) and os.path.basename(run_folder(TOKEN)) == run_folder(TOKEN)
