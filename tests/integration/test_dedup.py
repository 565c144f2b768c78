"""Deduplication ids of enqueues: one unfinished workflow per queue holds a ``dedup_id``."""

from __future__ import annotations

import threading

import pytest

import dbos_agent as da
from tests.helpers import new_id

GATE: dict[str, threading.Event] = {}


@da.step
def wait_for_gate(key: str) -> str:
    GATE[key].wait(60)
    return key


@da.durable_workflow
def dedup_gated(key: str) -> str:
    return wait_for_gate(key)


def test_a_second_enqueue_with_the_id_is_refused_until_the_first_finishes(
    queue_runtime: da.Runtime,
) -> None:
    q = da.Queue(new_id("q"))
    key = new_id("gate")
    GATE[key] = threading.Event()
    first = q.enqueue(dedup_gated, key, dedup_id="order-1")
    with pytest.raises(da.errors.DuplicateEnqueueError) as refused:
        q.enqueue(dedup_gated, key, dedup_id="order-1")
    assert refused.value.queue_name == q.name and refused.value.dedup_id == "order-1"
    assert "order-1" in str(refused.value) and q.name in str(refused.value)

    # another queue, or another id, is not a duplicate
    other = da.Queue(new_id("q"))
    GATE[key].set()
    other.enqueue(dedup_gated, key, dedup_id="order-1").result(30)
    q.enqueue(dedup_gated, key, dedup_id="order-2").result(30)

    assert first.result(30) == key
    again = q.enqueue(dedup_gated, key, dedup_id="order-1")  # the first has finished
    assert again.result(30) == key


def test_the_same_workflow_id_enqueued_again_is_not_a_duplicate(
    queue_runtime: da.Runtime,
) -> None:
    q = da.Queue(new_id("q"))
    key, wid = new_id("gate"), new_id()
    GATE[key] = threading.Event()
    first = q.enqueue(dedup_gated, key, workflow_id=wid, dedup_id="same")
    again = q.enqueue(dedup_gated, key, workflow_id=wid, dedup_id="same")
    GATE[key].set()
    assert first.workflow_id == again.workflow_id == wid
    assert again.result(30) == key


def test_concurrent_enqueues_with_one_id_let_exactly_one_in(dbos_agent_database_url: str) -> None:
    queue = new_id("unserved")  # no process serves it: every winner stays ENQUEUED
    threads, barrier = 12, threading.Barrier(12)
    won: list[str] = []
    refused: list[da.errors.DuplicateEnqueueError] = []
    lock = threading.Lock()
    with da.Client(dbos_agent_database_url, pool_size=threads) as client:

        def enqueue() -> None:
            barrier.wait()
            try:
                handle = client.enqueue(queue, "some_workflow", 1, dedup_id="once")
            except da.errors.DuplicateEnqueueError as exc:
                with lock:
                    refused.append(exc)
            else:
                with lock:
                    won.append(handle.workflow_id)

        workers = [threading.Thread(target=enqueue) for _ in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
        assert len(won) == 1 and len(refused) == threads - 1
        assert {exc.dedup_id for exc in refused} == {"once"}
        assert client.retrieve(won[0]).status() == da.WorkflowStatus.ENQUEUED

        # a cancelled one has finished: the id is free again
        client.cancel(won[0])
        client.enqueue(queue, "some_workflow", 2, dedup_id="once")


def test_an_empty_dedup_id_is_refused(dbos_agent_database_url: str) -> None:
    with (
        da.Client(dbos_agent_database_url) as client,
        pytest.raises(da.errors.InvalidIdentifierError, match="dedup id"),
    ):
        client.enqueue(new_id("q"), "some_workflow", dedup_id="")


def test_a_resume_that_would_hold_the_id_twice_is_refused(dbos_agent_database_url: str) -> None:
    queue = new_id("unserved")
    with da.Client(dbos_agent_database_url) as client:
        first = client.enqueue(queue, "some_workflow", dedup_id="again")
        client.cancel(first.workflow_id)
        second = client.enqueue(queue, "some_workflow", dedup_id="again")
        with pytest.raises(da.errors.DuplicateEnqueueError) as refused:
            client.resume(first.workflow_id)
        assert (refused.value.queue_name, refused.value.dedup_id) == (queue, "again")
        assert first.status() == da.WorkflowStatus.CANCELLED
        assert second.status() == da.WorkflowStatus.ENQUEUED
