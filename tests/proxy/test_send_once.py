"""trimflow.proxy.send_once in a taddons context: its options, a request it leaves alone, and the hold and answer of
a refused reference (no network). Uploads, references and the inline re-send through a real mitmdump and the fake
provider's Files APIs: tests/e2e/test_send_once.py."""

from __future__ import annotations

import pytest
from mitmproxy import exceptions, http
from mitmproxy.test import taddons, tutils

from trimflow import proxy
from trimflow.proxy import _resend
from trimflow.proxy.send_once import SendOnce, _Referenced

from .flows import llm_flow

TENANT = b"t" * 16


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"trimflow_send_once_lifetime": "soon"}, "trimflow: trimflow_send_once_lifetime: invalid duration 'soon'"),
        ({"trimflow_send_once_lifetime": "0"}, "trimflow: trimflow_send_once_lifetime needs a duration above 0"),
        ({"trimflow_send_once_deadline": "none"}, "trimflow: trimflow_send_once_deadline needs a duration above 0"),
    ],
)
def test_a_bad_option_is_refused_with_one_line(options: dict[str, str], problem: str) -> None:
    instance = SendOnce(proxy.SharedState())
    with taddons.context(instance) as tctx, pytest.raises(exceptions.OptionsError) as raised:
        tctx.configure(instance, **options)
    assert str(raised.value).startswith(problem)


def test_the_lifetime_and_deadline_are_read() -> None:
    instance = SendOnce(proxy.SharedState())
    with taddons.context(instance) as tctx:
        tctx.configure(instance, trimflow_send_once_lifetime="2h", trimflow_send_once_deadline="0.5s")
        assert (instance.refs.lifetime, instance.deadline) == (7200.0, 0.5)


def referenced(instance: SendOnce, status: int, answer: bytes, file_id: str = "file_7") -> http.HTTPFlow:
    flow = llm_flow("anthropic", host="api.anthropic.com")
    instance.sent[flow] = _Referenced(TENANT, b'{"inline": true}', frozenset({file_id}), None)
    flow.response = tutils.tresp(status_code=status, content=answer, headers=http.Headers(content_type="application/json"))
    return flow


def test_an_answer_refusing_no_reference_makes_no_coroutine_and_frees_the_inline_body() -> None:
    instance = SendOnce(proxy.SharedState())
    with taddons.context(instance):
        ok = referenced(instance, 200, b"{}")
        instance.hold.responseheaders(ok)
        assert ok not in instance.sent and ok.response is not None and not ok.response.stream
        other = referenced(instance, 400, b'{"error": {"message": "prompt is too long"}}')
        assert instance.response(other) is None and other not in instance.sent


GEMINI_REFUSAL = (
    b'{"error":{"code":403,"message":"You do not have permission to access the File abc-7 or it may not exist.","status":"PERMISSION_DENIED"}}'
)


@pytest.mark.parametrize(
    ("status", "answer", "file_id"),
    [
        (404, b'{"type":"error","error":{"type":"not_found_error","message":"File not found: file_7"}}', "file_7"),
        (403, GEMINI_REFUSAL, "files/abc-7"),  # Gemini's, naming the file without its `files/`
    ],
)
def test_a_refusal_naming_a_referenced_file_is_held_back_and_answered(status: int, answer: bytes, file_id: str) -> None:
    instance = SendOnce(proxy.SharedState())
    extended = _resend.extend_size_check()
    try:
        with taddons.context(instance):
            flow = referenced(instance, status, answer, file_id)
            assert flow.response is not None
            flow.response.stream = True  # as the metrics addon streams an answer on a streamed path
            instance.hold.responseheaders(flow)
            assert flow in _resend.held_answers and flow.response.stream is False
            answer = instance.response(flow)
            assert answer is not None  # the inline re-send, which needs mitmproxy's proxy core: the e2e test runs it
            answer.close()
            instance.hold.response(flow)
            assert flow not in _resend.held_answers
    finally:
        if extended:
            _resend.restore_size_check()
