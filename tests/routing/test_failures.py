"""Backend trouble: 5xx, connection resets, stalls and garbage streams.

Before the first content event a failure cools the backend down (`failure`) and the request fails
over; after it, the client gets an `error` event and the request stays on the backend that
streamed. When every backend is cooling after failures, the answer is 503 with Retry-After and no
upstream is asked.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from devtools.mock_http import Reply
from tests.routing.conftest import launch
from tests.support.client import complete, datas, post, stream
from tests.support.gateway import StartGateway
from tests.support.observe import completions, deployments, metric, row_view, scrape, seconds_until
from tests.support.replies import answer, chunk, error, stream_answer, usage_chunk
from tests.support.upstream import ReplayUpstream, played, reply_json, reply_sse

FAILURE_COOLDOWN = 4
# OpenRouter: the model's provider failed mid-answer; `finish_reason: error` and an `error` on the choice
OPENROUTER_CHOICE = {"index": 0, "finish_reason": "error", "error": {"code": 502, "message": "Provider returned error"}}
OPENROUTER_ERROR_CHUNK = {"id": "gen-1", "choices": [{**OPENROUTER_CHOICE, "delta": {"content": ""}}]}
# msgspec raises RecursionError past its depth (a 500 before): a malformed answer like any other
TOO_DEEP = "[" * 1000 + "1" + "]" * 1000
TOO_DEEP_CHUNK = 'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}], "zz": ' + TOO_DEEP + "}\n\n"
OPENROUTER_ERROR_ANSWER = {
    "id": "gen-1",
    "object": "chat.completion",
    "choices": [{**OPENROUTER_CHOICE, "message": {"role": "assistant", "content": ""}}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 0, "total_tokens": 10},
}


@pytest.mark.parametrize(
    ("reply", "cooldown"),
    [
        pytest.param(error(502), FAILURE_COOLDOWN, id="502"),
        pytest.param(error(503, "unavailable"), FAILURE_COOLDOWN, id="503"),
        pytest.param(
            reply_json(503, {"object": "error", "message": "engine dead", "code": 503}), FAILURE_COOLDOWN, id="503-flat"
        ),
        pytest.param(error(503, "unavailable", {"retry-after": "2"}), 2, id="503-retry-after"),
        pytest.param(error(529, "overloaded"), FAILURE_COOLDOWN, id="529"),
    ],
)
async def test_5xx_fails_over_and_cools_the_backend_down(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream, reply: Reply, cooldown: float
) -> None:
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta}, common={"failure_cooldown_s": FAILURE_COOLDOWN})
    alpha.enqueue(reply)
    beta.enqueue(answer("from beta"), repeat=2)
    response = await complete(gw)
    assert response.status_code == 200, response.text
    assert response.json()["provider"] == "beta"
    state = await deployments(gw)
    assert (state["alpha"]["ready"], state["alpha"]["cooling_reason"]) == (False, "failure")
    assert cooldown - 0.5 < seconds_until(state["alpha"]["cooling_until"]) <= cooldown
    assert state["alpha"]["breaker_open"] is False  # one failure is below the breaker's minimum samples
    assert state["beta"]["ready"] is True
    again = await complete(gw)
    assert again.json()["provider"] == "beta"
    assert len(completions(alpha)) == 1
    first, second = await gw.ledger_rows()
    assert row_view(first) == ("ok", None, None, 2, "beta")
    assert row_view(second) == ("ok", None, None, 1, "beta")
    samples = await scrape(gw)
    assert metric(samples, "switchyard_cooldowns_total", provider="alpha", reason="failure") == 1
    assert metric(samples, "switchyard_attempts_total", provider="alpha", outcome="transient") == 1


async def test_three_backends_fail_over_in_priority_order(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream, gamma: ReplayUpstream
) -> None:
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta, "gamma": gamma})
    alpha.enqueue(error(502))
    beta.enqueue(error(503, "unavailable"))
    gamma.enqueue(answer("from gamma"))
    response = await complete(gw)
    assert response.status_code == 200, response.text
    assert response.json()["provider"] == "gamma"
    assert [len(completions(u)) for u in (alpha, beta, gamma)] == [1, 1, 1]
    (row,) = await gw.ledger_rows()
    assert row_view(row) == ("ok", None, None, 3, "gamma")
    samples = await scrape(gw)
    assert metric(samples, "switchyard_retries_total", model="chat-1") == 2
    assert metric(samples, "switchyard_failovers_total", model="chat-1", provider="gamma") == 1


async def test_every_backend_cooling_after_failures_is_503_without_upstream_request(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta}, common={"failure_cooldown_s": FAILURE_COOLDOWN})
    alpha.enqueue(error(502))
    beta.enqueue(error(503, "unavailable"))
    refused = await complete(gw)
    assert refused.status_code == 502, refused.text
    assert refused.json()["error"]["message"] == "all backends refused the request (alpha: 502; beta: 503)"
    assert refused.json()["error"]["type"] == "upstream_error"
    state = await deployments(gw)
    assert {name: (d["ready"], d["cooling_reason"]) for name, d in state.items()} == {
        "alpha": (False, "failure"),
        "beta": (False, "failure"),
    }

    response = await complete(gw)
    # no model named: the default model all the same, with the same answer and a row naming it
    unnamed = await post(gw, {"messages": [{"role": "user", "content": [{"kind": "text", "data": "hi"}]}]})
    for refusal in (response, unnamed):
        assert refusal.status_code == 503, refusal.text
        assert refusal.json()["error"]["type"] == "unavailable"
        assert refusal.json()["error"]["message"] == "no backend is available for this model"
        assert refusal.headers["retry-after"] == str(FAILURE_COOLDOWN)
    assert len(completions(alpha)) == 1
    assert len(completions(beta)) == 1
    first, second, third = await gw.ledger_rows()
    assert row_view(first) == ("error", "upstream_error", 502, 2, "beta")
    assert row_view(second) == ("error", "unavailable", 503, 0, None)
    assert (row_view(third), third["model"]) == (("error", "unavailable", 503, 0, None), "chat-1")


# -- connection resets ---------------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
async def test_reset_before_the_first_byte_fails_over(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream, streamed: bool
) -> None:
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta})
    alpha.enqueue(played(stream_answer("lost") if streamed else answer("lost"), reset_after=0))
    beta.enqueue(stream_answer("from beta") if streamed else answer("from beta"))
    if streamed:
        _, frames = await stream(gw)
        assert frames[0][1]["provider"] == "beta"
        assert [d["type"] for d in datas(frames)] == ["stream_start", "text_start", "text_delta", "text_end", "finish"]
        assert frames[2][1]["delta"] == "from beta"
    else:
        response = await complete(gw)
        assert response.status_code == 200, response.text
        assert response.json()["provider"] == "beta"
    assert len(completions(alpha)) == 1
    (row,) = await gw.ledger_rows()
    assert row_view(row) == ("ok", None, None, 2, "beta")
    state = await deployments(gw)
    assert (state["alpha"]["ready"], state["alpha"]["cooling_reason"]) == (False, "failure")


async def test_reset_after_the_first_content_chunk_is_an_error_event_without_failover(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta})
    alpha.enqueue("mock_reset_midstream")  # one content delta ("Hi"), then a TCP reset
    _, frames = await stream(gw)
    assert datas(frames)[1:] == [
        {"type": "text_start", "text_id": "text_0"},
        {"type": "text_delta", "text_id": "text_0", "delta": "Hi"},
        {"type": "text_end", "text_id": "text_0"},
        {
            "type": "error",
            "error": {"message": frames[-1][1]["error"]["message"], "type": "upstream_error", "code": 502},
        },
    ]
    assert frames[0][1]["provider"] == "alpha"
    assert completions(beta) == []
    (row,) = await gw.ledger_rows()
    assert row_view(row) == ("error", "upstream_error", 502, 1, "alpha")
    state = await deployments(gw)
    assert state["alpha"]["cooling_reason"] == "failure"
    assert (state["alpha"]["in_flight"], state["beta"]["in_flight"]) == (0, 0)


# -- stalls and timeouts ---------------------------------------------------------------------------


async def test_idle_stall_after_content_is_a_504_error_event(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta}, common={"timeouts": {"idle": 0.3}})
    alpha.enqueue(played(stream_answer("Hel"), stall_after=1))
    started = time.monotonic()
    _, frames = await stream(gw)
    elapsed = time.monotonic() - started
    assert [d["type"] for d in datas(frames)] == ["stream_start", "text_start", "text_delta", "text_end", "error"]
    assert frames[-1][1]["error"]["code"] == 504
    assert frames[-1][1]["error"]["type"] == "upstream_error"
    assert 0.3 <= elapsed < 1.5
    assert completions(beta) == []
    (row,) = await gw.ledger_rows()
    assert row_view(row) == ("error", "upstream_error", 504, 1, "alpha")


async def test_idle_stall_before_content_on_every_backend_is_504(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta}, common={"timeouts": {"idle": 0.3}})
    role_only = reply_sse([chunk({"role": "assistant"}), chunk({"content": "never"}), chunk({}, "stop")], stall_after=1)
    alpha.enqueue(role_only)
    beta.enqueue(role_only)
    started = time.monotonic()
    response = await complete(gw, stream=True)
    elapsed = time.monotonic() - started
    assert response.status_code == 504, response.text
    assert response.json()["error"]["type"] == "upstream_error"
    assert "retry-after" not in response.headers
    assert 0.6 <= elapsed < 2.0  # two attempts of one idle timeout each
    (row,) = await gw.ledger_rows()
    assert row_view(row) == ("error", "upstream_error", 504, 2, "beta")
    samples = await scrape(gw)
    assert metric(samples, "switchyard_attempts_total", provider="alpha", outcome="timeout") == 1
    assert metric(samples, "switchyard_attempts_total", provider="beta", outcome="timeout") == 1


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
async def test_first_byte_stall_on_every_backend_is_504_within_the_bound(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream, streamed: bool
) -> None:
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta}, common={"timeouts": {"first_byte": 0.3}})
    late = stream_answer("late") if streamed else answer("late")
    alpha.enqueue(played(late, first_byte_delay_s=5.0))
    beta.enqueue(played(late, first_byte_delay_s=5.0))
    started = time.monotonic()
    response = await complete(gw, stream=streamed)
    elapsed = time.monotonic() - started
    assert response.status_code == 504, response.text
    assert response.json()["error"]["type"] == "upstream_error"
    assert 0.6 <= elapsed < 1.5  # two attempts of `first_byte` each, nowhere near the 5 s stall
    (row,) = await gw.ledger_rows()
    assert row_view(row) == ("error", "upstream_error", 504, 2, "beta")
    state = await deployments(gw)
    assert {name: d["cooling_reason"] for name, d in state.items()} == {"alpha": "failure", "beta": "failure"}


# -- garbage and truncated streams -----------------------------------------------------------------


async def test_an_answer_that_finishes_with_an_error_fails_over(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    """OpenRouter's `finish_reason: "error"` ends a failed answer: no clean (empty) 200 from alpha."""
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta})
    alpha.enqueue(reply_json(200, OPENROUTER_ERROR_ANSWER))
    beta.enqueue(answer("from beta"))
    response = await complete(gw)
    assert response.status_code == 200, response.text
    assert (response.json()["provider"], response.json()["message"]["content"][0]["data"]) == ("beta", "from beta")
    (row,) = await gw.ledger_rows()
    assert row_view(row) == ("ok", None, None, 2, "beta")


async def test_an_answer_that_finishes_with_an_error_is_named_by_its_status(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    """The upstream said it failed: the attempt's cause is its 502, not "malformed response"."""
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta})
    alpha.enqueue(reply_json(200, OPENROUTER_ERROR_ANSWER))
    beta.enqueue(error(500))
    response = await complete(gw)
    assert response.status_code == 502
    assert response.json()["error"]["message"] == "all backends refused the request (alpha: 502; beta: 500)"


async def test_the_usage_of_an_answer_that_finished_with_an_error_is_recorded(
    start_gateway: StartGateway, alpha: ReplayUpstream
) -> None:
    """The upstream billed the prompt of the answer it failed: the row keeps those tokens."""
    gw = await launch(start_gateway, {"alpha": alpha}, common={"failure_cooldown_s": 0})  # both attempts on alpha
    alpha.enqueue(reply_json(200, OPENROUTER_ERROR_ANSWER))
    after = [OPENROUTER_ERROR_CHUNK, usage_chunk(7, 1), chunk({"content": "y"})]
    alpha.enqueue(reply_sse([chunk({"content": "x"}), *after]))
    assert (await complete(gw)).status_code == 502
    _, frames = await stream(gw)
    assert [d["type"] for d in datas(frames)] == ["stream_start", "text_start", "text_delta", "text_end", "error"]
    assert "".join(d.get("delta", "") for d in datas(frames)) == "x"  # no content after the failed finish
    whole, streamed = await gw.ledger_rows()
    assert [row_view(row) for row in (whole, streamed)] == [("error", "upstream_error", 502, 1, "alpha")] * 2
    assert [(row["input_tokens"], row["output_tokens"]) for row in (whole, streamed)] == [(10, 0), (7, 1)]


ABORT_CHUNK = {"id": "cmpl-a", "choices": [{"index": 0, "delta": {}, "finish_reason": "abort"}]}


@pytest.mark.parametrize("idle", [5, 0.3], ids=["idle-after-the-grace", "idle-within-it"])
@pytest.mark.parametrize("content_first", [False, True], ids=["before-content", "after-content"])
async def test_an_upstream_quiet_after_its_failed_finish_fails_at_once(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream, content_first: bool, idle: float
) -> None:
    """vLLM's `abort`, then nothing (the connection open): the usage it may send next is waited for
    a second at most (or the idle timeout, when shorter), then the attempt fails as what the
    upstream said (502), not after the idle timeout as a 504."""
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta}, common={"timeouts": {"idle": idle}})
    head = [chunk({"content": "Half"})] if content_first else []
    alpha.enqueue(reply_sse([*head, ABORT_CHUNK], done=False, stall_after=len(head) + 1))
    beta.enqueue(stream_answer("from beta"))
    started = time.monotonic()
    _, frames = await stream(gw)
    assert time.monotonic() - started < 2.5
    if content_first:
        assert [d["type"] for d in datas(frames)][-1] == "error"
        assert frames[-1][1]["error"]["code"] == 502
    else:
        assert frames[0][1]["provider"] == "beta"  # failed over
    (row,) = await gw.ledger_rows()
    assert (row["error_status"], row["error_type"]) == ((502, "upstream_error") if content_first else (None, None))


async def test_an_error_chunk_after_a_failed_finish_does_not_change_the_failure(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    """The answer failed (`abort`): an error chunk after it (a 400 would be the client's fault, no
    failover) is not read; the failure fails over as before."""
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta})
    late = {"error": {"message": "bad request", "type": "invalid_request_error", "code": 400}}
    alpha.enqueue(reply_sse([ABORT_CHUNK, late, usage_chunk(5, 0)]))
    beta.enqueue(stream_answer("from beta"))
    _, frames = await stream(gw)
    assert frames[0][1]["provider"] == "beta"
    assert [d["type"] for d in datas(frames)] == ["stream_start", "text_start", "text_delta", "text_end", "finish"]
    samples = await scrape(gw)
    assert metric(samples, "switchyard_attempts_total", provider="alpha", outcome="transient") == 1


async def test_a_whole_answer_nested_too_deep_fails_over(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta})
    deep = '{"choices": [{"message": {"content": "x", "reasoning": ' + TOO_DEEP + '}, "finish_reason": "stop"}]}'
    alpha.enqueue(Reply(status=200, headers=[("content-type", "application/json")], chunks=[deep.encode()]))
    beta.enqueue(answer("from beta"))
    response = await complete(gw)
    assert (response.status_code, response.json()["provider"]) == (200, "beta")


async def test_an_error_event_after_the_finish_reason_is_still_an_error(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    """Only an event cut short is dropped at the end: an error the upstream sent, whole but for
    its blank line, is an error as it is with one."""
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta})
    late_error = 'data: {"error": {"message": "engine died", "code": 503}}'
    alpha.enqueue(reply_sse([chunk({"content": "Whole"}), chunk({}, "stop"), late_error], done=False))
    _, frames = await stream(gw)
    assert [d["type"] for d in datas(frames)] == ["stream_start", "text_start", "text_delta", "text_end", "error"]


NOT_A_LENGTH = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: abc\r\n\r\n{}"


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
async def test_a_malformed_answer_fails_over_and_its_connection_is_closed(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream, streamed: bool
) -> None:
    """A malformed head (`content-length: abc`) is backend trouble like a reset: fail over, cool
    the backend down, and close the connection it came on (the mock never closes one itself)."""
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta}, common={"failure_cooldown_s": FAILURE_COOLDOWN})
    alpha.enqueue(Reply(raw=NOT_A_LENGTH))
    beta.enqueue(stream_answer("from beta") if streamed else answer("from beta"))
    if streamed:
        _, frames = await stream(gw)
        assert frames[0][1]["provider"] == "beta"
        assert [d["type"] for d in datas(frames)] == ["stream_start", "text_start", "text_delta", "text_end", "finish"]
    else:
        response = await complete(gw)
        assert response.status_code == 200, response.text
        assert response.json()["provider"] == "beta"
    assert len(completions(alpha)) == 1
    (row,) = await gw.ledger_rows()
    assert row_view(row) == ("ok", None, None, 2, "beta")
    assert (await deployments(gw))["alpha"]["cooling_reason"] == "failure"
    samples = await scrape(gw)
    assert metric(samples, "switchyard_attempts_total", provider="alpha", outcome="transient") == 1
    async with asyncio.timeout(2):
        await alpha.wait_idle()
    assert beta.open_connections == 1  # a good answer's connection stays in the pool


@pytest.mark.parametrize(
    "payloads",
    [
        pytest.param(["data: <html>bad gateway</html>\n\n", "data: not json at all\n\n"], id="non-json-data-then-eof"),
        pytest.param(['data: {"choices": [{"delta": \n\n'], id="broken-json"),
        pytest.param([chunk({"role": "assistant", "content": ""})], id="eof-without-finish-before-content"),
        pytest.param([": keep-alive\n\n"], id="comment-only-then-eof"),
        pytest.param([OPENROUTER_ERROR_CHUNK], id="openrouter-error-finish"),
        pytest.param([TOO_DEEP_CHUNK], id="nested-too-deep"),
    ],
)
async def test_garbage_or_truncated_stream_before_content_fails_over(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream, payloads: list[Any]
) -> None:
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta})
    alpha.enqueue(reply_sse(payloads, done=False))
    beta.enqueue(stream_answer("from beta"))
    _, frames = await stream(gw)
    assert frames[0][1]["provider"] == "beta"
    assert [d["type"] for d in datas(frames)] == ["stream_start", "text_start", "text_delta", "text_end", "finish"]
    (row,) = await gw.ledger_rows()
    assert row_view(row) == ("ok", None, None, 2, "beta")
    assert (await deployments(gw))["alpha"]["cooling_reason"] == "failure"


async def test_an_event_cut_short_after_the_finish_reason_is_dropped(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    """The connection ends inside the usage chunk, after the finish reason: the answer is whole.
    The SSE standard drops an event the stream ends inside; its usage stays unknown (NULL)."""
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta})
    cut = 'data: {"id":"chatcmpl-r1","choices":[],"usage":{"prompt_tokens":10,"compl'
    alpha.enqueue(reply_sse([chunk({"content": "Whole"}), chunk({}, "stop"), cut], done=False))
    _, frames = await stream(gw)
    assert [d["type"] for d in datas(frames)] == ["stream_start", "text_start", "text_delta", "text_end", "finish"]
    assert datas(frames)[-1]["finish_reason"] == "stop"
    (row,) = await gw.ledger_rows()
    assert row_view(row) == ("ok", None, None, 1, "alpha")
    assert (row["input_tokens"], row["output_tokens"]) == (None, None)


async def test_an_upstream_quiet_after_its_finish_reason_ends_the_answer_whole(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream
) -> None:
    """The finish reason came, then nothing: no usage, no `[DONE]`, no EOF. At the idle timeout
    the answer ends as at EOF, whole (it was a 504 error event, the answer thrown away)."""
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta}, common={"timeouts": {"idle": 0.5}})
    alpha.enqueue(reply_sse([chunk({"content": "Whole"}), chunk({}, "stop")], done=False, stall_after=2))
    _, frames = await stream(gw)
    assert [d["type"] for d in datas(frames)] == ["stream_start", "text_start", "text_delta", "text_end", "finish"]
    assert datas(frames)[-1]["finish_reason"] == "stop"
    (row,) = await gw.ledger_rows()
    assert row_view(row) == ("ok", None, None, 1, "alpha")


@pytest.mark.parametrize(
    "tail",
    [
        pytest.param(['data: {"choices": [{"delta": \n\n'], id="broken-json"),
        pytest.param(["data: not json\n\n"], id="eof-without-finish"),
        pytest.param([OPENROUTER_ERROR_CHUNK, usage_chunk(10, 1)], id="openrouter-error-finish"),
        pytest.param([TOO_DEEP_CHUNK], id="nested-too-deep"),
    ],
)
async def test_garbage_or_truncated_stream_after_content_is_an_error_event(
    start_gateway: StartGateway, alpha: ReplayUpstream, beta: ReplayUpstream, tail: list[Any]
) -> None:
    gw = await launch(start_gateway, {"alpha": alpha, "beta": beta})
    alpha.enqueue(reply_sse([chunk({"content": "Half"}), *tail], done=False))
    _, frames = await stream(gw)
    assert frames[0][1]["provider"] == "alpha"
    assert [d["type"] for d in datas(frames)] == ["stream_start", "text_start", "text_delta", "text_end", "error"]
    assert frames[-1][1]["error"]["code"] == 502
    assert completions(beta) == []
    (row,) = await gw.ledger_rows()
    assert row_view(row) == ("error", "upstream_error", 502, 1, "alpha")
    billed = (10, 1) if tail[0] is OPENROUTER_ERROR_CHUNK else (None, None)  # the usage after the error finish
    assert (row["input_tokens"], row["output_tokens"]) == billed
