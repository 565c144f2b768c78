"""``send_bulk``: many messages in one statement, from a workflow (one step, replayed
without sending again), from outside one and from a ``Client``; all of them or none."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import dbos_agent as da
from dbos_agent import aio
from dbos_agent.testing import Inspector
from tests.helpers import new_id


@da.durable_workflow
def receiver(topic: str | None) -> Any:
    return da.recv(topic, timeout=60)


@da.durable_workflow
def broadcaster(targets: list[str], topic: str | None) -> str:
    da.send_bulk([(target, f"hello {target}", topic) for target in targets])
    return "sent"


@da.durable_workflow
async def broadcaster_async(targets: list[str]) -> str:
    await aio.send_bulk([(target, {"n": i}) for i, target in enumerate(targets)])
    return "sent"


@pytest.fixture
def client(runtime: da.Runtime, dbos_agent_database_url: str) -> Iterator[da.Client]:
    with da.Client(dbos_agent_database_url) as c:
        yield c


def _receivers(n: int, topic: str | None = None) -> list[da.WorkflowHandle[Any]]:
    return [da.start(receiver, topic) for _ in range(n)]


def test_a_workflow_sends_to_many_in_one_step_and_a_replay_sends_nothing(
    runtime: da.Runtime, inspector: Inspector
) -> None:
    receivers = _receivers(3, "news")
    targets = [r.workflow_id for r in receivers]
    sender = da.start(broadcaster, targets, "news")
    assert sender.result(30) == "sent"
    assert [r.result(30) for r in receivers] == [f"hello {t}" for t in targets]
    assert [s.name for s in sender.steps()] == ["dbos_agent.send_bulk"]

    fork = da.operations.fork(sender.workflow_id, 1)
    assert fork.result(30) == "sent"
    for target in targets:
        (sent,) = inspector.messages(target)
        assert sent.idempotency_key == f"{sender.workflow_id}:0:{targets.index(target)}"
        assert sent.topic == "news" and sent.consumed_seq == 0


def test_the_async_twin_is_the_same_step(runtime: da.Runtime) -> None:
    receivers = _receivers(2)
    sender = da.start(broadcaster_async, [r.workflow_id for r in receivers])
    assert sender.result(30) == "sent"
    assert [r.result(30) for r in receivers] == [{"n": 0}, {"n": 1}]
    assert [s.name for s in sender.steps()] == ["dbos_agent.send_bulk"]


def test_a_missing_destination_stores_none_of_them(
    runtime: da.Runtime, client: da.Client, inspector: Inspector
) -> None:
    (alive,) = _receivers(1, "t")
    missing = new_id("missing")
    with pytest.raises(da.WorkflowNotFoundError, match=missing):
        client.send_bulk([(alive.workflow_id, 1, "t"), (missing, 2, "t")])
    assert inspector.messages(alive.workflow_id) == []

    sender = da.start(broadcaster, [alive.workflow_id, missing], "t")
    with pytest.raises(da.WorkflowNotFoundError, match=missing):
        sender.result(30)
    assert inspector.messages(alive.workflow_id) == []
    assert [s.status for s in sender.steps()] == [da.records.StepStatus.ERROR]


def test_a_client_sends_with_keys_once_and_outside_a_workflow_it_is_a_plain_call(
    runtime: da.Runtime, client: da.Client, inspector: Inspector
) -> None:
    first, second = _receivers(2, "t")
    batch = [(first.workflow_id, "a", "t", "key-a"), (second.workflow_id, "b", "t", "key-b")]
    assert client.send_bulk(batch) == 2
    assert client.send_bulk(batch) == 0, "keys sent before store nothing"
    assert client.send_bulk([]) == 0
    assert (first.result(30), second.result(30)) == ("a", "b")

    third = da.start(receiver, None)
    da.send_bulk([(third.workflow_id, "plain")])
    assert third.result(30) == "plain"
    assert [m.message for m in inspector.messages(third.workflow_id)] == ["plain"]


def test_bad_messages_are_refused_before_anything_is_sent(client: da.Client) -> None:
    with pytest.raises(TypeError, match="tuples"):
        client.send_bulk([("only-an-id",)])  # type: ignore[list-item]
    with pytest.raises(da.errors.InvalidIdentifierError):
        client.send_bulk([("", "x")])
