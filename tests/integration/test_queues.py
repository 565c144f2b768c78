"""Queues in one process: enqueue, dedup, priority, limits, rate limit, clients."""

from __future__ import annotations

import threading
import time
from collections import Counter

import psycopg
import pytest

import dbos_agent as da
from dbos_agent._engine.queues import isolated_queues
from dbos_agent.testing import Inspector, advance_clock, clock_offset, dispatch_once
from tests.helpers import direct_and_pooled, new_id, per_test, wait_until

ORDER: list[str] = per_test([])
RUNS: Counter[str] = per_test(Counter())
IN_FLIGHT: Counter[str] = per_test(Counter())
_lock = threading.Lock()


@da.step
def record(tag: str, seconds: float) -> str:
    with _lock:
        IN_FLIGHT["now"] += 1
        IN_FLIGHT["max"] = max(IN_FLIGHT["max"], IN_FLIGHT["now"])
        ORDER.append(tag)
        RUNS[tag] += 1
    time.sleep(seconds)
    with _lock:
        IN_FLIGHT["now"] -= 1
    return tag


@da.durable_workflow
def queued(tag: str, seconds: float = 0.0) -> str:
    return record(tag, seconds)


@pytest.fixture
def queue_runtime(database_url: str, executor_id: str):  # type: ignore[no-untyped-def]
    with isolated_queues():
        rt = da.launch(database_url, executor_id=executor_id, workers=8)
        yield rt
        rt.shutdown(grace=5)


def test_enqueue_runs_and_dedups(queue_runtime: da.Runtime) -> None:
    q = da.Queue(new_id("q"))
    wid = new_id()
    first = q.enqueue(queued, "a", workflow_id=wid)
    again = q.enqueue(queued, "a", workflow_id=wid)
    assert first.result(30) == again.result(30) == "a"
    assert RUNS["a"] == 1
    info = first.get_info()
    assert info.status == da.WorkflowStatus.SUCCESS


def test_enqueueing_one_id_again_and_again_right_away_runs_it_once(
    queue_runtime: da.Runtime,
) -> None:
    """A re-enqueue takes no place in the run table: the dispatcher that dequeues the
    workflow meanwhile is never turned away (it was, and the workflow stayed PENDING)."""
    q = da.Queue(new_id("q"))
    wid = new_id()
    handles = [q.enqueue(queued, "again", workflow_id=wid) for _ in range(5)]
    assert [h.result(10) for h in handles] == ["again"] * 5
    assert RUNS["again"] == 1


def test_an_id_enqueued_again_while_it_is_dequeued_still_runs_once(
    queue_runtime: da.Runtime,
) -> None:
    # The second enqueue's look at the row races with the dispatcher taking it: whichever
    # holds the run in this process, it runs (it was once left to nobody for 30 s).
    q = da.Queue(new_id("q"))
    for i in range(60):
        wid = new_id()
        first = q.enqueue(queued, f"race{i}", workflow_id=wid)
        again = q.enqueue(queued, f"race{i}", workflow_id=wid)
        assert first.result(20) == again.result(20) == f"race{i}"
    assert set(RUNS.values()) == {1}


def test_worker_concurrency_and_priority(queue_runtime: da.Runtime) -> None:
    q = da.Queue(new_id("q"), worker_concurrency=1)
    gate = q.enqueue(queued, "first", 0.3)
    wait_until(lambda: "first" in ORDER, 10, '"first" holds the only slot')
    handles = [q.enqueue(queued, f"p{p}", priority=p) for p in (5, 1, 3)]
    for h in [gate, *handles]:
        h.result(30)
    assert ORDER == ["first", "p1", "p3", "p5"]
    assert IN_FLIGHT["max"] == 1


@direct_and_pooled
def test_global_concurrency_limit(queue_runtime: da.Runtime) -> None:
    q = da.Queue(new_id("q"), concurrency=2)
    handles = [q.enqueue(queued, f"c{i}", 0.1) for i in range(8)]
    assert sorted(h.result(60) for h in handles) == sorted(f"c{i}" for i in range(8))
    assert IN_FLIGHT["max"] == 2


def test_rate_limit(queue_runtime: da.Runtime, dbos_agent_database_url: str) -> None:
    name = new_id("q")
    q = da.Queue(name, rate_limit=(3, 0.5))
    handles = [q.enqueue(queued, f"r{i}") for i in range(7)]
    for h in handles:
        h.result(60)
    with psycopg.connect(dbos_agent_database_url) as conn:
        starts = [
            r[0].timestamp()
            for r in conn.execute(
                "SELECT dequeued_at FROM dbos_agent.workflows WHERE queue_name = %s "
                "ORDER BY dequeued_at",
                (name,),
            )
        ]
    assert len(starts) == 7
    for i, t in enumerate(starts):
        assert sum(1 for u in starts[i:] if u < t + 0.5) <= 3
    assert starts[-1] - starts[0] >= 1.0  # 7 starts at 3 per 0.5 s need three windows


@direct_and_pooled
def test_a_rate_limit_period_passes_when_the_clock_moves(queue_runtime: da.Runtime) -> None:
    """Three an hour: the next three start once the database clock moved an hour, not
    after one (the test does not sleep through the period)."""
    q = da.Queue(new_id("q"), rate_limit=(3, 3600))
    handles = [q.enqueue(queued, f"h{i}") for i in range(7)]
    try:
        for started in (3, 6, 7):
            wait_until(lambda n=started: len(ORDER) >= n, 20, f"{started} started")  # type: ignore[misc]
            assert len(ORDER) == started  # the limit holds until the period has passed
            advance_clock(3600)
        assert sorted(h.result(20) for h in handles) == sorted(f"h{i}" for i in range(7))
    finally:
        advance_clock(-clock_offset())


def test_a_client_enqueues_without_the_function(
    queue_runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    q = da.Queue(new_id("q"))
    with da.Client(dbos_agent_database_url) as client:
        handle = client.enqueue(q.name, "queued", "from-client", seconds=0.0)
        assert handle.result(30) == "from-client"
        assert client.retrieve(handle.workflow_id).status() == da.WorkflowStatus.SUCCESS
        same = client.enqueue(q.name, "queued", "ignored", workflow_id=handle.workflow_id)
        assert same.result(30) == "from-client"
        with pytest.raises(da.WorkflowNotFoundError):
            client.retrieve("nope")
    assert RUNS["from-client"] == 1


def test_enqueued_inputs_that_do_not_fit_fail_clearly(
    queue_runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    q = da.Queue(new_id("q"))
    with da.Client(dbos_agent_database_url) as client:
        handle = client.enqueue(q.name, "queued", "a", "b", "c")
        with pytest.raises(da.errors.WorkflowInputsError, match="do not fit"):
            handle.result(30)


def test_a_cancelled_queued_workflow_resumes_into_its_queue(queue_runtime: da.Runtime) -> None:
    q = da.Queue(new_id("q"), worker_concurrency=1)
    blocker = q.enqueue(queued, "blocker", 0.5)
    wait_until(lambda: "blocker" in ORDER, 10, "the blocker holds the only slot")
    waiting = q.enqueue(queued, "waiting")
    da.operations.cancel(waiting.workflow_id)
    assert waiting.status() == da.WorkflowStatus.CANCELLED
    resumed = da.operations.resume(waiting.workflow_id)
    assert resumed.status() == da.WorkflowStatus.ENQUEUED  # its queue's limit still holds
    assert blocker.result(30) == "blocker"
    assert resumed.result(30) == "waiting"
    assert IN_FLIGHT["max"] == 1 and RUNS["waiting"] == 1


@da.durable_workflow
def queued_waiter(tag: str) -> str:
    return record(tag + str(da.recv("go", timeout=None)), 0.0)


@pytest.mark.parametrize("count_suspended", [False, True], ids=["slot-freed", "slot-held"])
def test_a_suspended_workflow_frees_its_queue_slot_unless_the_queue_counts_it(
    queue_runtime: da.Runtime, inspector: Inspector, count_suspended: bool
) -> None:
    q = da.Queue(new_id("q"), concurrency=1, count_suspended=count_suspended)
    first = q.enqueue(queued_waiter, "first")
    wait_until(
        lambda: inspector.status(first.workflow_id) == da.WorkflowStatus.SUSPENDED,
        10,
        "the first suspended in recv",
    )
    second = q.enqueue(queued, "second")
    if count_suspended:
        dispatch_once()  # a dispatcher pass, now: the suspended one holds the only slot
        assert inspector.status(second.workflow_id) == da.WorkflowStatus.ENQUEUED
    else:
        assert second.result(10) == "second"  # the suspended one holds no slot
    da.send(first.workflow_id, "!", topic="go")
    assert first.result(10) == "first!"
    assert second.result(10) == "second"


@da.step(retry_on=(ConnectionError,), give_up_after=3600, interval=20, jitter=0)
def flaky_dependency(tag: str) -> str:
    RUNS[tag] += 1
    if RUNS[tag] == 1:
        raise ConnectionError("the dependency is down")
    return tag


@da.durable_workflow
def queued_on_dependency(tag: str) -> str:
    return flaky_dependency(tag)


def test_a_workflow_waiting_for_its_retry_keeps_its_queue_slot(
    queue_runtime: da.Runtime, inspector: Inspector
) -> None:
    """A queue bounds the load on a dependency: one that waits for that dependency to come
    back keeps its slot, so an outage does not dequeue the backlog into the same wait."""
    q = da.Queue(new_id("q"), concurrency=1)
    first = q.enqueue(queued_on_dependency, "first")
    wait_until(
        lambda: (
            (info := inspector.workflow(first.workflow_id)) is not None
            and info.retrying is not None
            and info.status == da.WorkflowStatus.SUSPENDED
        ),
        10,
        "the first to wait for its retry",
    )
    second = q.enqueue(queued, "second")
    dispatch_once()  # a dispatcher pass, now: the retrying one holds the only slot
    assert inspector.status(second.workflow_id) == da.WorkflowStatus.ENQUEUED
    advance_clock(25)  # its next attempt: it finishes, and the slot goes to the next
    assert first.result(10) == "first"
    assert second.result(10) == "second"
