"""The model step over real HTTP (scripted server) and real Postgres: replay, streaming,
self-healing retries, and that no API key reaches the database."""

from __future__ import annotations

import email.utils
import time
import uuid
from typing import Any

import anthropic
import httpx2
import psycopg
import pytest
from anthropic.types import Message, MessageParam

import dbos_agent as da
from dbos_agent.agent import Model, ModelRetryPolicy
from dbos_agent.agent.model import MODEL_STEP_NAME
from dbos_agent.agent.retrying import is_retryable, retry_after_seconds
from dbos_agent.agent.scripted_server import (
    Delay,
    Fail,
    Reply,
    ScriptedServer,
    ScriptItem,
    text,
    tool_use,
)
from tests.helpers import SimulatedCrash, new_id, per_test

HELLO: list[MessageParam] = [{"role": "user", "content": "hello"}]

# The workflows below read their model from here: a Model holds a client, which is
# configuration and must never be a workflow input.
CURRENT: dict[str, Any] = per_test({})
CRASH_AT: dict[str, int] = per_test({})


def serve(script: list[ScriptItem]) -> ScriptedServer:
    return ScriptedServer(script)


def fast_model(server: ScriptedServer | str, api_key: str = "scripted", **kwargs: Any) -> Model:
    url = server if isinstance(server, str) else server.url
    client = anthropic.Anthropic(base_url=url, api_key=api_key)
    options: dict[str, Any] = {"interval": 0.01, "max_interval": 0.05, "retries": 5}
    options.update(kwargs)
    return Model(client, model="claude-sonnet-4-5", max_tokens=256, **options)


def model() -> Model:
    m = CURRENT["model"]
    assert isinstance(m, Model)
    return m


@da.durable_workflow(name="agent_test_conversation")
def conversation(turns: int, stream: str = "odd") -> list[str]:
    """Calls the model ``turns`` times, streaming every other call (or ``"all"``)."""
    messages: list[MessageParam] = list(HELLO)
    seen: list[str] = []
    wid = da.current_workflow_id()
    for turn in range(turns):
        if turn % 2 or stream == "all":
            reply = model().stream(messages, on_text=CURRENT.setdefault("deltas", []).append)
        else:
            reply = model().create(messages)
        assert isinstance(reply, Message), type(reply)
        seen.append("".join(b.text for b in reply.content if b.type == "text"))
        messages.append(reply.to_param())
        messages.append({"role": "user", "content": f"and then? ({turn})"})
        if CRASH_AT.get(str(wid)) == turn:
            raise SimulatedCrash(f"after turn {turn}")
    return seen


def test_model_step_records_the_message_and_replays_it_typed_without_paying(
    runtime: da.Runtime,
) -> None:
    script: list[ScriptItem] = [
        Reply([text("first answer")], usage=(10, 3)),
        Reply([text("second, streamed answer")], usage=(20, 4)),
        Reply([text("third")], usage=(30, 1)),
    ]
    with serve(script) as server:
        CURRENT["model"] = fast_model(server)
        wid = new_id()
        CRASH_AT[wid] = 1
        with pytest.raises(SimulatedCrash), da.workflow_id(wid):
            conversation(3)
        assert server.paid_calls == 2
        streamed = "".join(CURRENT.pop("deltas"))
        assert streamed == "second, streamed answer"

        steps = da.operations.list_steps(wid)
        assert [s.name for s in steps] == [MODEL_STEP_NAME, MODEL_STEP_NAME]
        assert steps[0].output["usage"]["input_tokens"] == 10
        assert steps[1].output["content"][0]["text"] == "second, streamed answer"

        CRASH_AT.clear()
        with da.workflow_id(wid):
            assert conversation(3) == ["first answer", "second, streamed answer", "third"]
        # replayed turns were neither paid again nor streamed again
        assert server.paid_calls == 3
        assert CURRENT.get("deltas") == []  # the replayed stream was not streamed again
        # the resumed request carried the rebuilt conversation
        assert len(server.requests[-1].body["messages"]) == 5


def test_529_storm_then_success_is_retried_with_attempts_counted(runtime: da.Runtime) -> None:
    with serve([Fail(529), Fail(529), Fail(529), Reply([text("finally")])]) as server:
        CURRENT["model"] = fast_model(server)
        wid = new_id()
        with da.workflow_id(wid):
            assert conversation(1) == ["finally"]
        (step,) = da.operations.list_steps(wid)
        assert step.status == "SUCCESS" and step.attempts == 4
        assert [r.status for r in server.requests] == [529, 529, 529, 200]
        # one retry loop: the client itself never retried (no retry-count header above 0)
        assert all(not r.retry_count for r in server.requests)


def test_5xx_and_a_dropped_connection_are_retried(runtime: da.Runtime) -> None:
    with serve([Fail(500), Fail(503), Reply([text("ok")])]) as server:
        CURRENT["model"] = fast_model(server)
        url = server.url
        wid = new_id()
        with da.workflow_id(wid):
            assert conversation(1) == ["ok"]
        assert da.operations.list_steps(wid)[0].attempts == 3

    # nothing listens on this port any more: connection refused, then give up (with no
    # horizon, as give_up_after=None asks, only `retries` decides)
    CURRENT["model"] = fast_model(url, retries=2, give_up_after=None)
    wid = new_id()
    with pytest.raises(anthropic.APIConnectionError), da.workflow_id(wid):
        conversation(1)
    (step,) = da.operations.list_steps(wid)
    assert step.status == "ERROR" and step.attempts == 3


def test_429_honours_retry_after(runtime: da.Runtime) -> None:
    with serve([Fail(429, retry_after=0.6), Reply([text("after the wait")])]) as server:
        CURRENT["model"] = fast_model(server)  # own backoff: 10 ms
        wid = new_id()
        with da.workflow_id(wid):
            assert conversation(1) == ["after the wait"]
        first, second = server.requests
        assert second.timestamp - first.timestamp >= 0.55
        assert da.operations.list_steps(wid)[0].attempts == 2


def test_400_is_recorded_and_not_retried(runtime: da.Runtime) -> None:
    with serve([Fail(400, message="messages: bad shape"), Reply([text("unused")])]) as server:
        CURRENT["model"] = fast_model(server)
        wid = new_id()
        with pytest.raises(anthropic.BadRequestError), da.workflow_id(wid):
            conversation(1)
        (step,) = da.operations.list_steps(wid)
        assert step.status == "ERROR" and step.attempts == 1
        assert step.error is not None and step.error["type"] == "anthropic.BadRequestError"
        assert len(server.requests) == 1
        # the recorded error replays as the same error, without a request
        with pytest.raises(anthropic.BadRequestError, match="bad shape"), da.workflow_id(wid):
            conversation(1)
        assert len(server.requests) == 1


def test_server_saying_do_not_retry_is_obeyed(runtime: da.Runtime) -> None:
    with serve([Fail(503, should_retry=False), Reply([text("unused")])]) as server:
        CURRENT["model"] = fast_model(server)
        with pytest.raises(anthropic.InternalServerError), da.workflow_id(new_id()):
            conversation(1)
        assert len(server.requests) == 1


def test_a_timeout_is_retried(runtime: da.Runtime) -> None:
    script: list[ScriptItem] = [Delay(1.5, then=Reply([text("too late")])), Reply([text("ok")])]
    with serve(script) as server:
        CURRENT["model"] = fast_model(server, timeout=0.3)
        wid = new_id()
        with da.workflow_id(wid):
            assert conversation(1) == ["ok"]
        assert da.operations.list_steps(wid)[0].attempts == 2


def test_streamed_reply_with_tool_use_is_a_complete_message(runtime: da.Runtime) -> None:
    reply = Reply([text("Reading it."), tool_use("read_file", {"path": "a.py"})], usage=(7, 5))
    with serve([reply]) as server:
        CURRENT["model"] = fast_model(server)
        wid = new_id()
        CRASH_AT[wid] = 0
        with pytest.raises(SimulatedCrash), da.workflow_id(wid):
            conversation(1, "all")
        assert "".join(CURRENT.pop("deltas")) == "Reading it."
        (step,) = da.operations.list_steps(wid)
        assert step.output["stop_reason"] == "tool_use"
        assert step.output["content"][1]["input"] == {"path": "a.py"}
        usage = step.output["usage"]
        assert (usage["input_tokens"], usage["output_tokens"]) == (7, 5)
        CRASH_AT.clear()
        with da.workflow_id(wid):
            assert conversation(1, "all") == ["Reading it."]
        assert server.paid_calls == 1 and CURRENT.get("deltas") == []


def test_no_api_key_ever_lands_in_the_database(
    runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    secret = f"sk-ant-api03-SECRET-{uuid.uuid4().hex}"
    script: list[ScriptItem] = [
        Reply([text("fine")]),
        Fail(529),
        Reply([text("also fine")]),
        Fail(401, message="invalid x-api-key"),
    ]
    with serve(script) as server:
        CURRENT["model"] = fast_model(server, api_key=secret)
        ok, failed = new_id(), new_id()
        with da.workflow_id(ok):
            conversation(2)
        # a refused key is configuration: not recorded, the workflow stays PENDING
        with pytest.raises(da.errors.ConfigurationError), da.workflow_id(failed):
            conversation(1)
    with psycopg.connect(dbos_agent_database_url) as conn:
        dumped = [
            str(row[0])
            for table in ("workflows", "steps")
            for row in conn.execute(f"SELECT t::text FROM dbos_agent.{table} AS t")
        ]
    assert any(ok in row for row in dumped) and any(failed in row for row in dumped)
    assert not any(secret in row for row in dumped)
    assert not any("SECRET" in row for row in dumped)


def status_error(
    cls: type[anthropic.APIStatusError],
    status: int,
    body: object = None,
    headers: dict[str, str] | None = None,
) -> anthropic.APIStatusError:
    request = httpx2.Request("POST", "http://127.0.0.1/v1/messages")
    response = httpx2.Response(status, request=request, headers=headers or {})
    return cls("scripted", response=response, body=body)


def test_retry_classification() -> None:
    overloaded_event = {"type": "error", "error": {"type": "overloaded_error"}}
    invalid_event = {"type": "error", "error": {"type": "invalid_request_error"}}
    assert is_retryable(status_error(anthropic.OverloadedError, 529))
    assert is_retryable(status_error(anthropic.RateLimitError, 429))
    assert is_retryable(status_error(anthropic.InternalServerError, 502))
    assert is_retryable(status_error(anthropic.APIStatusError, 200, overloaded_event))
    assert not is_retryable(status_error(anthropic.APIStatusError, 200, invalid_event))
    assert not is_retryable(status_error(anthropic.BadRequestError, 400))
    assert not is_retryable(status_error(anthropic.AuthenticationError, 401))
    no = {"x-should-retry": "false"}
    assert not is_retryable(status_error(anthropic.InternalServerError, 500, headers=no))
    assert is_retryable(httpx2.ReadError("connection cut mid-stream"))
    assert not is_retryable(ValueError("not an API error"))

    def after(headers: dict[str, str]) -> float | None:
        return retry_after_seconds(status_error(anthropic.RateLimitError, 429, headers=headers))

    assert after({"retry-after": "3"}) == 3.0
    assert after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    in_a_minute = email.utils.formatdate(time.time() + 60, usegmt=True)
    assert 55 < (after({"retry-after": in_a_minute}) or 0) <= 60
    assert after({}) is None

    policy = ModelRetryPolicy(retries=3, interval=0.01, jitter=0.0, max_retry_after=5.0)
    assert policy.delay_before_retry(1, status_error(anthropic.OverloadedError, 529)) == 0.01
    assert policy.delay_before_retry(1, status_error(anthropic.BadRequestError, 400)) is None
    rate_limited = status_error(anthropic.RateLimitError, 429, headers={"retry-after": "2"})
    assert policy.delay_before_retry(1, rate_limited) == 2.0
    too_long = status_error(anthropic.RateLimitError, 429, headers={"retry-after": "600"})
    assert policy.delay_before_retry(1, too_long) is None  # give up rather than block
    assert policy.delay_before_retry(4, rate_limited) is None  # retries used up


@pytest.mark.parametrize("problem", ["no key", "refused key"])
def test_missing_credentials_leave_the_workflow_pending_not_failed(
    dbos_agent_postgres_url: str, executor_id: str, monkeypatch: pytest.MonkeyPatch, problem: str
) -> None:
    """No API key is this process's configuration, not the model call's outcome: nothing is
    recorded, and a process that has the configuration finishes the workflow."""
    from dbos_agent.testing import fresh_database

    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    script: list[ScriptItem] = [Reply([text("hi")])]
    if problem == "refused key":
        script.insert(0, Fail(401, "authentication_error"))
    with serve(script) as server, fresh_database(dbos_agent_postgres_url) as url:
        wid = new_id("unconfigured")
        rt = da.launch(url, executor_id=executor_id, workers=2)
        try:
            key = None if problem == "no key" else "wrong"
            CURRENT["model"] = Model(
                anthropic.Anthropic(base_url=server.url, api_key=key, auth_token=None),
                model="claude-sonnet-4-5",
                max_tokens=64,
            )
            with (
                pytest.raises(da.errors.ConfigurationError, match="ANTHROPIC_API_KEY"),
                da.workflow_id(wid),
            ):
                conversation(1)
            assert da.retrieve(wid).status() == da.WorkflowStatus.PENDING
            assert da.operations.list_steps(wid) == []
        finally:
            rt.shutdown()
        CURRENT["model"] = fast_model(server)  # the next process has a client
        rt = da.launch(url, executor_id=executor_id, workers=2)
        try:
            assert da.retrieve(wid).result(timeout=30) == ["hi"]
        finally:
            rt.shutdown()
