"""The audit's usage and cost: cache reads and writes summed per conversation and in total, each request priced
at the price table's rates for its model (--prices for another table), an unknown model or a request with no
usage counted apart and never priced at 0, and recordings with no usage at all read as before."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from trimflow._prices import load_prices
from trimflow._record import Record
from trimflow.testing import session_body

from .helpers import SHOT, audit, audit_json, llm_flow, markdown_as_text, only_conversation, rows, write_bytes, write_dump

# Anthropic's usage as its answers carry it: a first turn that writes the prefix, then turns that read it.
USAGE = [
    {"input_tokens": 40, "cache_creation_input_tokens": 3000, "cache_read_input_tokens": 0, "output_tokens": 120},
    {"input_tokens": 35, "cache_creation_input_tokens": 900, "cache_read_input_tokens": 3000, "output_tokens": 80},
    {"input_tokens": 30, "cache_creation_input_tokens": 1000, "cache_read_input_tokens": 3900, "output_tokens": 60},
]
MODEL = "claude-sonnet-4-5"  # the model session_body names


def answer(usage: dict) -> bytes:
    return orjson.dumps({"id": "msg_1", "type": "message", "role": "assistant", "content": [{"type": "text", "text": "ok"}], "usage": usage})


def flows(model: str = MODEL, usages: list[dict] = USAGE) -> list:
    out = []
    for turn, usage in enumerate(usages, 1):
        body = orjson.dumps({**session_body("anthropic", turn, SHOT, "image/png"), "model": model})
        out.append(llm_flow(turn=turn, body=body, answer=answer(usage)))
    return out


def expected_cost(model: str, usage: dict) -> float:
    price = load_prices().for_model(model)
    assert price is not None
    read, write = usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]
    return price.cost(usage["input_tokens"], write, read, usage["output_tokens"])


def test_cache_reads_and_writes_are_summed_and_priced_per_conversation(tmp_path, capsys) -> None:
    dump = write_dump(tmp_path / "run.mitm", flows())
    code, report, err = audit_json(capsys, dump)
    assert code == 0, err
    records = rows(report)
    assert [r["usage_cache_write_tokens"] for r in records] == [3000, 900, 1000]
    assert [r["usage_cache_read_tokens"] for r in records] == [0, 3000, 3900]
    assert [r["usage_input_tokens"] for r in records] == [3040, 3935, 4930]  # the whole prompt, as before
    assert [r["usage_output_tokens"] for r in records] == [120, 80, 60]
    costs = [expected_cost(MODEL, u) for u in USAGE]
    assert [r["cost_usd"] for r in records] == pytest.approx(costs)
    # Sonnet: 3000 written at $3.75/M, 40 in at $3/M, 120 out at $15/M
    assert records[0]["cost_usd"] == pytest.approx((3000 * 3.75 + 40 * 3 + 120 * 15) / 1e6)
    totals = only_conversation(report)["totals"]
    assert (totals["usage_cache_read_tokens"], totals["usage_cache_write_tokens"]) == (6900, 4900)
    assert (totals["usage_input_tokens"], totals["usage_output_tokens"], totals["usage_requests"]) == (11_905, 260, 3)
    assert totals["cost_usd"] == pytest.approx(sum(costs))
    assert totals["cost_priced_requests"] == 3 and totals["cost_unpriced_requests"] == {}
    assert report["summary"]["totals"]["cost_usd"] == pytest.approx(sum(costs))
    assert report["summary"]["prices_source"] == "rules/prices.yaml"


def test_the_text_report_shows_usage_and_cost(tmp_path, capsys) -> None:
    dump = write_dump(tmp_path / "run.mitm", flows())
    code, out, _ = audit(capsys, dump)
    assert code == 0
    total = f"${sum(expected_cost(MODEL, u) for u in USAGE):,.4f}"
    assert f"  usage: in 11,905 (cached 6,900, written 4,900) · out 260 · cost {total}\n" in out
    assert f"\nusage: in 11,905 (cached 6,900, written 4,900) · out 260 · cost {total} (prices: rules/prices.yaml)\n" in out
    header = next(line for line in out.splitlines() if line.strip().startswith("turn"))
    assert "in tokens  cache read  cache write  out tokens" in header and " cost " in header
    assert f"${expected_cost(MODEL, USAGE[1]):,.4f}" in out  # a turn's own cost


def test_markdown_and_html_show_the_cost(tmp_path, capsys) -> None:
    dump = write_dump(tmp_path / "run.mitm", flows())
    total = f"${sum(expected_cost(MODEL, u) for u in USAGE):,.4f}"
    _, markdown, _ = audit(capsys, dump, "--format", "markdown")
    assert f"Usage: in 11,905 (cached 6,900, written 4,900) · out 260 · cost {total} (prices: rules/prices.yaml)." in markdown_as_text(markdown)
    assert "| in tokens | cache read | cache write | out tokens | cost |" in markdown
    _, html, _ = audit(capsys, dump, "--format", "html")
    assert f"<b>{total}</b>" in html and "cache read 6,900 · written 4,900" in html
    assert f"<li>usage: in 11,905 (cached 6,900, written 4,900) · out 260 · cost {total}</li>" in html


def test_a_model_without_a_price_has_an_unknown_cost_not_zero(tmp_path, capsys) -> None:
    dump = write_dump(tmp_path / "run.mitm", flows(model="my-finetune-7b"))
    _, report, _ = audit_json(capsys, dump)
    assert [r["cost_usd"] for r in rows(report)] == [None] * 3
    assert [r["cost_unknown"] for r in rows(report)] == ["no price for my-finetune-7b"] * 3
    totals = only_conversation(report)["totals"]
    assert totals["cost_usd"] is None and totals["cost_unpriced_requests"] == {"no price for my-finetune-7b": 3}
    assert totals["usage_cache_write_tokens"] == 4900  # the usage is still summed
    _, out, _ = audit(capsys, dump)
    assert "cost unknown (no price for my-finetune-7b)" in out and "$0.0000" not in out


def test_a_partly_priced_run_names_what_its_cost_leaves_out(tmp_path, capsys) -> None:
    priced = flows()
    unpriced = flows(model="my-finetune-7b", usages=USAGE[:1])
    unpriced[0].request.content = orjson.dumps({**orjson.loads(unpriced[0].request.content), "system": "another conversation"})
    dump = write_dump(tmp_path / "run.mitm", priced + unpriced)
    _, out, _ = audit(capsys, dump)
    total = f"${sum(expected_cost(MODEL, u) for u in USAGE):,.4f}"
    assert f"cost {total} + unknown for 1 request (no price for my-finetune-7b) (prices: rules/prices.yaml)" in out


def test_another_price_table(tmp_path, capsys) -> None:
    prices = write_bytes(
        tmp_path / "prices.yaml",
        b"prices:\n  - family: mine\n    match: ['my-finetune-*']\n    input: 1\n    cache_write: 2\n    cache_read: 0.5\n    output: 4\n"
        b"    source: https://example.com/pricing\n    as_of: 2026-11-24\n",
    )
    dump = write_dump(tmp_path / "run.mitm", flows(model="my-finetune-7b"))
    _, report, _ = audit_json(capsys, dump, "--prices", prices)
    first = USAGE[0]
    assert rows(report)[0]["cost_usd"] == pytest.approx((40 * 1 + 3000 * 2 + 0 * 0.5 + 120 * 4) / 1e6)
    assert report["summary"]["prices_source"] == str(prices) and first["input_tokens"] == 40
    _, report, _ = audit_json(capsys, write_dump(tmp_path / "claude.mitm", flows()), "--prices", prices)
    assert only_conversation(report)["totals"]["cost_usd"] is None  # that table has no Claude price


def test_a_bad_price_table_is_refused_with_its_file_and_line(tmp_path, capsys) -> None:
    entry = b"  - family: mine\n    match: ['x*']\n    input: free\n    cache_read: 0\n    output: 1\n"
    entry += b"    source: https://example.com\n    as_of: 2026-11-24\n"
    prices = write_bytes(tmp_path / "prices.yaml", b"prices:\n" + entry)
    code, out, err = audit(capsys, write_dump(tmp_path / "run.mitm", flows()), "--prices", prices)
    assert code == 2 and out == ""
    assert err.startswith(f"trimflow audit: {prices}:4: `input` must be a price")


def record(turn: int, **fields) -> Record:
    return Record(
        ts="2026-11-24T10:00:00.000Z",
        conversation="c0ffee00",
        turn=turn,
        host="api.anthropic.com",
        path="/v1/messages",
        format="anthropic",
        model=MODEL,
        rule="defaults",
        mode="observe",
        **fields,
    )


def test_records_without_usage_read_as_before(tmp_path, capsys) -> None:
    # an observe-only run whose answers carried no usage, written before these fields existed
    lines = []
    for turn in (1, 2):
        data = record(turn, status=200, body_bytes_before=1000 * turn, body_bytes_after=1000 * turn).to_dict()
        for name in ("usage_input_tokens", "usage_cache_read_tokens", "usage_cache_write_tokens", "usage_output_tokens"):
            del data[name]
        lines.append(orjson.dumps(data))
    path = write_bytes(tmp_path / "old.jsonl", b"\n".join(lines) + b"\n")
    code, report, err = audit_json(capsys, path)
    assert code == 0, err
    assert [(r["usage_cache_read_tokens"], r["cost_usd"], r["cost_unknown"]) for r in rows(report)] == [(None, None, "no usage reported")] * 2
    totals = only_conversation(report)["totals"]
    assert totals["usage_requests"] == 0 and totals["cost_usd"] is None
    assert (totals["usage_cache_read_tokens"], totals["usage_cache_write_tokens"]) == (None, None)
    _, out, _ = audit(capsys, path)
    assert "  usage: none reported · cost unknown (no usage reported)" in out


def test_a_token_count_is_not_billed(tmp_path, capsys) -> None:
    usage = {"usage_input_tokens": 2000, "usage_cache_read_tokens": 1500, "usage_cache_write_tokens": 0, "usage_output_tokens": 10}
    turn = record(1, status=200, **usage)
    count = dataclasses.replace(record(None, status=200, usage_input_tokens=2100), kind="count_tokens", path="/v1/messages/count_tokens")
    path = write_bytes(tmp_path / "m.jsonl", turn.to_json() + b"\n" + count.to_json() + b"\n")
    _, report, _ = audit_json(capsys, path)
    by_kind = {r["kind"]: r for r in rows(report)}
    assert by_kind["count_tokens"]["cost_usd"] is None and by_kind["count_tokens"]["cost_unknown"] is None
    totals = only_conversation(report)["totals"]
    assert totals["usage_input_tokens"] == 2000 and totals["cost_unpriced_requests"] == {}
    price = load_prices().for_model(MODEL)
    assert totals["cost_usd"] == pytest.approx(price.cost(500, 0, 1500, 10))


@pytest.mark.parametrize(
    ("answer_body", "read", "write", "out"),
    [
        # OpenAI chat and Responses: a cached prompt, never a write
        (b'{"usage":{"prompt_tokens":5000,"completion_tokens":50,"prompt_tokens_details":{"cached_tokens":4096}}}', 4096, None, 50),
        (b'{"usage":{"input_tokens":5000,"input_tokens_details":{"cached_tokens":4096},"output_tokens":50}}', 4096, None, 50),
    ],
)
def test_openai_reads_are_priced_at_the_cached_rate(tmp_path, capsys, answer_body: bytes, read: int, write: None, out: int) -> None:
    wire = "openai-chat" if b"prompt_tokens" in answer_body else "openai-responses"
    body = orjson.dumps({**session_body(wire, 1, SHOT, "image/png"), "model": "gpt-4.1"})
    flow = llm_flow(wire, body=body, answer=answer_body, host="api.openai.com")
    _, report, _ = audit_json(capsys, write_dump(tmp_path / "run.mitm", [flow]))
    (row,) = rows(report)
    assert (row["usage_cache_read_tokens"], row["usage_cache_write_tokens"], row["usage_output_tokens"]) == (read, write, out)
    # GPT-4.1: 904 uncached at $2/M, 4096 cached at $0.50/M, 50 out at $8/M
    assert row["cost_usd"] == pytest.approx((904 * 2 + 4096 * 0.5 + 50 * 8) / 1e6)
    assert only_conversation(report)["totals"]["usage_cache_write_tokens"] is None


def test_the_cost_without_trimflow_models_the_cache_on_the_bodies_as_the_agent_sent_them(tmp_path, capsys) -> None:
    """Two enforce turns: the agent's prompts are the estimates before pruning scaled by the provider's count over the
    estimate sent (1,000 -> 1,100 tokens, then 3,000 -> 3,300); without trimflow the second reads the first whole and
    writes the rest. In observe mode what was sent is what the agent sent: the same cost."""
    first = record(1, status=200, est_tokens_before=1000, est_tokens_after=1000, usage_input_tokens=1100, usage_cache_read_tokens=0)
    first.usage_cache_write_tokens, first.usage_output_tokens = 1100, 10
    second = record(2, status=200, est_tokens_before=3000, est_tokens_after=1500, usage_input_tokens=1650, usage_cache_read_tokens=1000)
    second.usage_cache_write_tokens, second.usage_output_tokens, second.cache_break = 650, 10, "trimflow_cut"
    for r in (first, second):
        r.mode = "enforce"
    observed = record(1, status=200, est_tokens_before=2000, est_tokens_after=900, usage_input_tokens=2000, usage_cache_read_tokens=0)
    observed.conversation, observed.usage_cache_write_tokens, observed.usage_output_tokens = "0bbe5e00", 2000, 5
    path = write_bytes(tmp_path / "m.jsonl", b"\n".join(orjson.dumps(r.to_dict()) for r in (first, second, observed)) + b"\n")
    code, report, err = audit_json(capsys, path)
    assert code == 0, err
    price = load_prices().for_model(MODEL)
    assert price is not None
    actual = price.cost(0, 1100, 0, 10) + price.cost(0, 650, 1000, 10) + price.cost(0, 2000, 0, 5)
    without = price.cost(0, 1100, 0, 10) + price.cost(0, 2200, 1100, 10) + price.cost(0, 2000, 0, 5)
    totals = report["summary"]["totals"]
    assert totals["cost_usd"] == pytest.approx(actual)
    assert totals["cost_without_trimflow_usd"] == pytest.approx(without) and without > actual
    assert report["summary"]["cost_without_trimflow_method"].startswith("estimated from the records")
    _, page, _ = audit(capsys, path, "--format", "html")
    assert "without trimflow (estimated)" in page and "more than with trimflow" in page
