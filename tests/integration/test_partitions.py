"""Partitioned queues in one process: the key refused where it does not belong, limits
per partition, partitions served in turn, listing by partition."""

from __future__ import annotations

import threading

import pytest

import dbos_agent as da
from dbos_agent._engine.queues import isolated_queues
from dbos_agent.errors import PartitionKeyError
from dbos_agent.records import WorkflowFilter
from dbos_agent.testing import Inspector, advance_clock, clock_offset, dispatch_once
from tests.helpers import new_id, per_test, wait_until

GATES: dict[str, threading.Event] = per_test({})
STARTED: list[str] = per_test([])
_lock = threading.Lock()


@da.durable_workflow
def tenant_job(tenant: str, tag: str) -> str:
    with _lock:
        STARTED.append(tag)
    gate = GATES.get(tag)
    if gate is not None:
        assert gate.wait(30)
    return f"{tenant}:{tag}"


def test_a_key_is_needed_on_a_partitioned_queue_and_refused_on_another(
    queue_runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    partitioned = da.Queue(new_id("pq"), partitioned=True)
    plain = da.Queue(new_id("q"))
    missing, unwanted = new_id(), new_id()
    with pytest.raises(PartitionKeyError, match="needs a partition_key"):
        partitioned.enqueue(tenant_job, "a", "x", workflow_id=missing)
    with pytest.raises(PartitionKeyError, match="not partitioned"):
        plain.enqueue(tenant_job, "a", "x", workflow_id=unwanted, partition_key="a")
    with Inspector(dbos_agent_database_url) as db:
        assert db.workflow(missing) is None and db.workflow(unwanted) is None


def test_concurrency_holds_per_partition(queue_runtime: da.Runtime) -> None:
    """Concurrency 1 per tenant: the blocked tenant's second workflow waits, another
    tenant's runs meanwhile (DBOS's test_queue_partitions)."""
    q = da.Queue(new_id("pq"), concurrency=1, partitioned=True)
    GATES["blocked"] = threading.Event()
    first = q.enqueue(tenant_job, "busy", "blocked", partition_key="busy")
    behind = q.enqueue(tenant_job, "busy", "behind", partition_key="busy")
    wait_until(lambda: "blocked" in STARTED, 20, "the blocked workflow to start")
    other = q.enqueue(tenant_job, "idle", "other", partition_key="idle")
    assert other.result(20) == "idle:other"
    assert behind.get_info().status is da.WorkflowStatus.ENQUEUED
    assert behind.get_info().partition_key == "busy"
    GATES["blocked"].set()
    assert first.result(20) == "busy:blocked" and behind.result(20) == "busy:behind"


def test_worker_concurrency_holds_per_partition(queue_runtime: da.Runtime) -> None:
    q = da.Queue(new_id("pq"), worker_concurrency=2, partitioned=True)
    tags = [f"t{i}" for i in range(3)]
    for tag in tags:
        GATES[tag] = threading.Event()
    handles = [q.enqueue(tenant_job, "a", tag, partition_key="a") for tag in tags]
    other = q.enqueue(tenant_job, "b", "b0", partition_key="b")
    assert other.result(20) == "b:b0"
    wait_until(lambda: len(STARTED) >= 3, 20, "two of tenant a's and tenant b's")
    assert sorted(STARTED) == ["b0", "t0", "t1"]  # the third of a waits for a slot of a
    for tag in tags:
        GATES[tag].set()
    assert [h.result(20) for h in handles] == [f"a:{t}" for t in tags]


def test_the_rate_limit_holds_per_partition(queue_runtime: da.Runtime) -> None:
    q = da.Queue(new_id("pq"), rate_limit=(2, 3600), partitioned=True)
    handles = {
        tenant: [
            q.enqueue(tenant_job, tenant, f"{tenant}{i}", partition_key=tenant) for i in range(3)
        ]
        for tenant in ("a", "b")
    }
    try:
        wait_until(lambda: len(STARTED) >= 4, 20, "two of each tenant")
        assert sorted(STARTED) == ["a0", "a1", "b0", "b1"]
        advance_clock(3600)
        assert handles["a"][2].result(20) == "a:a2" and handles["b"][2].result(20) == "b:b2"
    finally:
        advance_clock(-clock_offset())


def test_partitions_are_served_in_turn(dbos_agent_database_url: str, executor_id: str) -> None:
    """One dequeue with 6 free slots, one tenant with 30 waiting and five with one each:
    each small tenant gets one of the six, however long the big tenant's backlog and
    however early it was enqueued."""
    with isolated_queues():
        rt = da.launch(
            dbos_agent_database_url, executor_id=executor_id, workers=6, run_queues=False
        )
        try:
            q = da.Queue(new_id("pq"), partitioned=True)
            for i in range(30):
                q.enqueue(tenant_job, "big", f"big{i}", partition_key="big")
            small = [f"small{i}" for i in range(5)]
            for tenant in small:
                q.enqueue(tenant_job, tenant, tenant, partition_key=tenant)
            assert dispatch_once() == 6
            wait_until(lambda: len(STARTED) == 6, 20, "the six dequeued to start")
            assert sorted(STARTED) == ["big0", *small]
        finally:
            rt.shutdown(grace=5)


def test_listing_by_partition_and_client_enqueue(
    queue_runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    name = new_id("pq")
    q = da.Queue(name, partitioned=True)
    mine = q.enqueue(tenant_job, "acme", "a1", partition_key="acme")
    q.enqueue(tenant_job, "other", "o1", partition_key="other").result(20)
    with da.Client(dbos_agent_database_url) as client:
        by_client = client.enqueue(name, "tenant_job", "acme", "a2", partition_key="acme")
        assert by_client.result(20) == "acme:a2"
        listed = client.list_workflows(queue=name, partition_key="acme")
    assert mine.result(20) == "acme:a1"
    assert {i.workflow_id for i in listed} == {mine.workflow_id, by_client.workflow_id}
    assert {i.partition_key for i in listed} == {"acme"}
    in_process = da.operations.list_workflows(queue_name=name, partition_key="other")
    assert [i.partition_key for i in in_process] == ["other"]


def test_a_bulk_cancel_by_partition_leaves_the_other_tenants(
    queue_runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    name = new_id("pq")
    q = da.Queue(name, partitioned=True)
    later = 3600.0  # nothing dequeued meanwhile: all wait in the queue
    acme = [
        q.enqueue(tenant_job, "acme", f"a{i}", partition_key="acme", delay=later) for i in range(3)
    ]
    other = q.enqueue(tenant_job, "other", "o", partition_key="other", delay=later)
    with da.Client(dbos_agent_database_url) as client:
        where = WorkflowFilter(queue_name=name, partition_key="acme")
        report = client.cancel_workflows(where=where)
        assert (report.matched, report.changed) == (3, 3)
        statuses = {h.workflow_id: client.get_workflow(h.workflow_id).status for h in acme}
        assert set(statuses.values()) == {da.WorkflowStatus.CANCELLED}
        assert client.get_workflow(other.workflow_id).status == da.WorkflowStatus.ENQUEUED
