"""Queues defined in the database: a change of a queue's limits made while a worker runs
is obeyed within seconds; an operator's setting wins over the code's until reset."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

import dbos_agent as da
from dbos_agent._engine.queues import isolated_queues
from dbos_agent.errors import PartitionKeyError
from tests.helpers import new_id, per_test, wait_until

GATE: list[threading.Event] = per_test([])
STARTED: list[int] = per_test([])
_lock = threading.Lock()


@da.durable_workflow
def gated(i: int) -> int:
    with _lock:
        STARTED.append(i)
    assert GATE[0].wait(30)
    return i


@pytest.fixture
def queue_runtime(dbos_agent_database_url: str, executor_id: str) -> Iterator[da.Runtime]:
    with isolated_queues():
        rt = da.launch(dbos_agent_database_url, executor_id=executor_id, workers=8)
        yield rt
        if GATE:
            GATE[0].set()
        rt.shutdown(grace=5)


def test_a_concurrency_set_while_running_is_obeyed(
    queue_runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    GATE.append(threading.Event())
    name = new_id("q")
    q = da.Queue(name, concurrency=1)
    handles = [q.enqueue(gated, i) for i in range(5)]
    with da.Client(dbos_agent_database_url) as client:
        wait_until(lambda: len(STARTED) == 1, 20, "the one the code's limit allows")
        wait_until(lambda: name in {i.name for i in client.queues()}, 20, "the queue recorded")
        recorded = {i.name: i for i in client.queues()}[name]
        assert (recorded.concurrency, recorded.source) == (1, "code")
        changed = client.set_queue(name, concurrency=3)
        assert (changed.concurrency, changed.source) == (3, "operator")
        wait_until(lambda: len(STARTED) == 3, 20, "three, as the database now says")
        assert len(STARTED) == 3  # and not more: the new limit holds
        assert sum(h.get_info().status is da.WorkflowStatus.ENQUEUED for h in handles) == 2
        client.set_queue(name, concurrency=None)  # no limit
        wait_until(lambda: len(STARTED) == 5, 20, "all of them")
        GATE[0].set()
        assert sorted(h.result(20) for h in handles) == list(range(5))
        reset = client.set_queue(name, reset=True)
        assert reset.source == "code"


def test_a_client_checks_the_partition_key_against_the_recorded_queue(
    queue_runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    name = new_id("pq")
    da.Queue(name, partitioned=True)
    with da.Client(dbos_agent_database_url) as client:
        wait_until(lambda: name in {q.name for q in client.queues()}, 20, "the queue recorded")
        with pytest.raises(PartitionKeyError):
            client.enqueue(name, "gated", 1)
        with pytest.raises(ValueError, match="concurrency must be >= 1"):
            client.set_queue(name, concurrency=0)
