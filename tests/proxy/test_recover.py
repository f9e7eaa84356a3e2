"""trimflow.proxy.recover in a taddons context: what is kept for a retry and what never is, the options, a retry
answered by a limit profile (no network), and the hold on error answers. Through a real mitmdump and the
real upstream: tests/e2e/test_recovery.py."""

from __future__ import annotations

import os

import pytest
from mitmproxy import exceptions, http
from mitmproxy.test import taddons

from trimflow import Limits, proxy
from trimflow._limit_errors import ANSWER_MAX
from trimflow.proxy import _resend, recover
from trimflow.proxy.metrics import AnswerScanner
from trimflow.proxy.options import confdir_path

from ..helpers import TrimflowAddons, requested
from .flows import llm_flow, write_rules

OPENAI = "https://api.openai.com:443"  # the upstream llm_flow's requests go to


@pytest.fixture
def chain(tmp_path):
    """All the addons over rules of 20 images, playing generic-8 ("Max images exceeded" past 8, no number named)."""
    instance = TrimflowAddons()
    with taddons.context(instance) as tctx:
        tctx.configure(
            instance,
            trimflow_rules=str(write_rules(tmp_path / "rules.yaml", 20)),
            trimflow_simulate="generic-8",
            trimflow_learned=str(tmp_path / "learned.yaml"),
            trimflow_retries=1,
        )
        instance.running()  # as mitmproxy once it runs: the hold's bound on answers of unknown length is on
        instance.tctx = tctx
        yield instance
        instance.done()


def recover_of(chain: TrimflowAddons) -> recover.Recover:
    return chain.get(proxy.Recover)


async def test_a_refusal_is_retried_within_a_stepped_down_cap_and_nothing_is_learned_until_one_is_accepted(chain, tmp_path) -> None:
    flow = llm_flow(turns=12)  # 12 images: the rules' 20 let them through, the profile's 8 refuse them
    await requested(chain, flow)
    assert flow.response is not None and flow.response.status_code == 400
    await recover_of(chain).response(flow)
    record = flow.metadata[proxy.META]
    # one retry allowed: the cap steps from 12 down to 10, which the profile refuses too; the client gets that answer
    assert (record["retries"], record["refused_status"], record["retry_limits"]) == (1, 400, "max_images=10")
    assert record["retry_reasons"] == "too many images (max 10, stepped down from what was refused)"
    assert (record["images_after"], record["status"], record["simulated"]) == (10, 400, "generic-8")
    # no retry was accepted: no figure was proven, nothing is learned
    assert recover_of(chain).tighten(OPENAI, "gpt-4o", Limits()).max_images is None
    assert recover_of(chain).limits_learned == 0
    assert flow not in recover_of(chain)._originals  # the body is let go with the flow's answer


async def test_with_no_retry_nothing_is_learned(chain) -> None:
    chain.tctx.configure(chain, trimflow_retries=0)
    flow = llm_flow(turns=12)
    await requested(chain, flow)
    await recover_of(chain).response(flow)
    assert flow.response.status_code == 400 and flow.metadata[proxy.META]["retries"] == 0
    assert recover_of(chain).tighten(OPENAI, "gpt-4o", Limits()).max_images is None
    assert recover_of(chain).summary() == (
        f"trimflow: refused for a limit: 1 requests, recovered by a retry: 0; limits learned: 0 ({recover_of(chain).learned.path})"
    )


async def test_the_next_request_goes_within_what_was_learned(chain) -> None:
    recover_of(chain).learned.learn(OPENAI, None, {"max_images": 8}, "400 max-images-exceeded")
    flow = llm_flow(turns=12)
    await requested(chain, flow)
    assert flow.response is None  # within the profile's 8: no simulated refusal
    assert flow.metadata[proxy.META]["images_after"] == 8
    assert flow.metadata[proxy.META]["learned_limits"] == "max_images=8"


async def test_a_limit_learned_for_one_upstream_never_applies_to_a_request_naming_its_host_elsewhere(chain) -> None:
    recover_of(chain).learned.learn(OPENAI, None, {"max_images": 8}, "400 max-images-exceeded")
    elsewhere = llm_flow(turns=12)
    elsewhere.request.port = 8443  # the same Host header, another upstream
    await requested(chain, elsewhere)
    assert elsewhere.metadata[proxy.META]["learned_limits"] is None


async def test_what_is_never_kept_for_a_retry(chain) -> None:
    signed = llm_flow(turns=3, headers={"authorization": "AWS4-HMAC-SHA256 Credential=x"})
    streamed = llm_flow(turns=3)
    streamed.request.raw_content = None  # streamed by mitmproxy (stream_large_bodies)
    other = llm_flow(turns=3)
    other.request.method = "GET"
    kept = llm_flow(turns=3)
    for flow in (signed, streamed, other, kept):
        recover_of(chain).request(flow)
    assert list(recover_of(chain)._originals) == [kept]
    chain.tctx.configure(chain, trimflow_mode="observe")
    observed = llm_flow(turns=3)
    recover_of(chain).request(observed)
    assert observed not in recover_of(chain)._originals
    chain.tctx.configure(chain, trimflow_mode="enforce", trimflow_recover=False)
    recover_of(chain).request(observed)
    assert observed not in recover_of(chain)._originals


async def test_an_answer_that_cannot_be_a_limit_error_makes_no_coroutine(chain) -> None:
    for status in (200, 401, 403, 404, 429, 500, 503):
        flow = llm_flow(turns=3)
        recover_of(chain).request(flow)
        flow.response = http.Response.make(status, b"{}")
        assert recover_of(chain).response(flow) is None
        assert flow not in recover_of(chain)._originals


async def test_an_answer_that_went_to_the_client_as_it_came_is_not_replaced(chain) -> None:
    flow = llm_flow(turns=12)
    await requested(chain, flow)
    assert flow.response is not None and flow.response.status_code == 400  # the profile's refusal
    flow.response.stream = True  # mitmproxy streamed it (stream_large_bodies): the client has it already
    assert recover_of(chain).response(flow) is None
    assert flow not in recover_of(chain)._originals


async def test_the_original_body_goes_as_soon_as_the_answer_cannot_be_a_limit_error(chain) -> None:
    answered, refused = llm_flow(turns=12), llm_flow(turns=12)
    for flow, status in ((answered, 200), (refused, 400)):
        recover_of(chain).request(flow)
        flow.response = http.Response.make(status, b"{}")
        recover_of(chain).responseheaders(flow)
    # A 200 streams on for as long as the model writes: its original is not held for that time.
    assert list(recover_of(chain)._originals) == [refused]


async def test_a_non_limit_400_is_left_as_it_came(chain) -> None:
    flow = llm_flow(turns=3)
    recover_of(chain).request(flow)
    await requested(chain, flow)
    answer = b'{"error":{"message":"The model `gpt-5-xl` does not exist","type":"invalid_request_error"}}'
    flow.response = http.Response.make(400, answer, {"content-type": "application/json"})
    await recover_of(chain).response(flow)
    assert flow.response.content == answer and flow.metadata[proxy.META]["retries"] == 0


def test_the_hold_keeps_a_candidate_error_answer_whole(chain) -> None:
    flow = llm_flow(turns=3)
    recover_of(chain).request(flow)
    flow.response = http.Response.make(400, b"", {"content-type": "text/event-stream"})
    scanner = AnswerScanner()
    flow.response.stream = scanner
    recover_of(chain).hold.responseheaders(flow)
    assert flow.response.stream is False
    assert _resend.held_answers[flow].stream is scanner  # what it streams with if it passes ANSWER_MAX
    ok = llm_flow(turns=3)
    recover_of(chain).request(ok)
    ok.response = http.Response.make(200, b"", {"content-type": "text/event-stream"})
    ok.response.stream = True
    recover_of(chain).hold.responseheaders(ok)
    assert ok.response.stream is True


@pytest.mark.parametrize(
    ("headers", "held"),
    [
        ({"content-length": str(ANSWER_MAX)}, True),
        ({"content-length": str(ANSWER_MAX + 1)}, False),
        ({"transfer-encoding": "chunked"}, True),  # its length unknown: held until it passes ANSWER_MAX, if it does
        ({}, True),  # read until the connection closes: likewise
    ],
    ids=["length-within", "length-over", "chunked", "until-close"],
)
def test_the_hold_decides_by_the_length_an_answer_gives(chain, headers: dict[str, str], held: bool) -> None:
    flow = llm_flow(turns=3)
    recover_of(chain).request(flow)
    flow.response = http.Response.make(400, b"", {"content-type": "text/event-stream"})
    flow.response.headers.pop("content-length", None)
    flow.response.headers.update(headers)
    recover_of(chain).hold.responseheaders(flow)
    assert recover_of(chain).hold.bounded  # this mitmproxy's HTTP layer takes the bound
    assert (flow.response.stream is False) == held == (flow in _resend.held_answers)
    assert (flow in recover_of(chain)._originals) == held  # an answer that streams through is never retried
    recover_of(chain).hold.response(flow)
    assert flow not in _resend.held_answers


def test_learned_path_follows_the_confdir() -> None:
    assert confdir_path("", "~/.mitmproxy") is None
    assert confdir_path(recover.DEFAULT_LEARNED, "/etc/mitm") == "/etc/mitm/trimflow-learned.yaml"
    assert confdir_path("~/l.yaml", "/x") == os.path.expanduser("~/l.yaml")


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"trimflow_retries": -1}, "trimflow: trimflow_retries must be 0 or more, not -1"),
        ({"trimflow_limit_errors": "{bad}"}, "trimflow: {bad}"),
        ({"trimflow_learned_ttl": "soon"}, "trimflow: trimflow_learned_ttl: invalid duration 'soon'"),
        ({"trimflow_learned_ttl": "0"}, "trimflow: trimflow_learned_ttl must be more than 0"),
    ],
)
def test_a_bad_option_is_refused_with_one_line(tmp_path, options: dict, problem: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("patterns: [{name: a, status: [400], match: 'x', limit: images}]\n")
    learned = tmp_path / "learned.yaml"
    learned.write_text("learned: [\n")
    values = {k: str(v).replace("{bad}", str(bad)).replace("{learned}", str(learned)) if isinstance(v, str) else v for k, v in options.items()}
    instance = proxy.Recover(proxy.SharedState(), proxy.Simulate(proxy.SharedState()))
    with taddons.context(instance) as tctx, pytest.raises(exceptions.OptionsError) as raised:
        tctx.configure(instance, **values)
    assert str(raised.value).startswith(problem.replace("{bad}", str(bad)).replace("{learned}", str(learned)))


def test_a_learned_file_that_cannot_be_read_is_said_once_and_left_as_it_is(tmp_path, caplog) -> None:
    learned = tmp_path / "learned.yaml"
    learned.write_text("learned: [\n")
    instance = proxy.Recover(proxy.SharedState(), proxy.Simulate(proxy.SharedState()))
    with taddons.context(instance) as tctx:
        tctx.configure(instance, trimflow_learned=str(learned))
        instance.learned.learn(OPENAI, None, {"max_images": 8}, "s")
        instance.learned.sync()
        assert instance.tighten(OPENAI, None, Limits()).max_images == 8
        instance.done()
    assert learned.read_text() == "learned: [\n"
    assert caplog.text.count("YAML syntax error") == 1


def test_the_exit_line_counts_refusals_recoveries_and_learned_limits() -> None:
    instance = proxy.Recover(proxy.SharedState(), proxy.Simulate(proxy.SharedState()))
    assert instance.summary() is None
    instance.refused, instance.recovered, instance.limits_learned = 3, 2, 1
    assert instance.summary() == "trimflow: refused for a limit: 3 requests, recovered by a retry: 2; limits learned: 1 (memory only)"
