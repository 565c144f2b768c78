"""What a peer's own test suite (DBOS Transact's) expects of workflows, children, steps,
queues and messages, each reproduced against the public API."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import dbos_agent as da
from dbos_agent._engine.children import START_CHILD_STEP
from dbos_agent.testing import Inspector
from tests.helpers import new_id, per_test, wait_until

STEP_RUNS: Counter[str] = per_test(Counter())
GATE = per_test(threading.Event())


@da.durable_workflow
def waiting_child(tag: str) -> str:
    return str(da.recv("go", timeout=60))


@da.durable_workflow
def parent_of_made_up_child(tag: str) -> str:
    """A background parent that starts a child under an id it makes up on every run."""
    child = da.start(waiting_child, tag, workflow_id=f"{tag}-{uuid.uuid4()}")
    return child.result()


def _children(inspector: Inspector, tag: str) -> list[str]:
    return [w.workflow_id for w in inspector.workflows() if w.workflow_id.startswith(f"{tag}-")]


def test_a_made_up_child_id_is_recorded_so_that_every_wake_finds_the_same_child(
    runtime: da.Runtime, inspector: Inspector
) -> None:
    tag = new_id("made-up")
    parent = da.start(parent_of_made_up_child, tag, workflow_id=tag)
    wait_until(lambda: len(_children(inspector, tag)) == 1, 30, "the child started")
    wait_until(
        lambda: inspector.statuses([tag])[tag] is da.WorkflowStatus.SUSPENDED,
        30,
        "the parent suspended on its child's result",
    )
    (child_id,) = _children(inspector, tag)
    da.send(child_id, "done", topic="go")
    assert parent.result(timeout=30) == "done"  # woken: the replay found the same child
    assert _children(inspector, tag) == [child_id]
    steps = da.operations.list_steps(tag)
    assert steps[0].name == START_CHILD_STEP
    # A fork past the start replays it: the same child, not a new one.
    assert da.operations.fork(tag, len(steps)).result(timeout=30) == "done"
    assert _children(inspector, tag) == [child_id]


@da.durable_workflow
def named_child(tag: str) -> str:
    return f"{tag}:{da.current_workflow_id()}"


@da.durable_workflow
def parent_with_assigned_ids(tag: str) -> list[str]:
    with da.workflow_id(f"{tag}-started"):
        started = da.start(named_child, tag).result()
    with da.workflow_id(f"{tag}-called"):
        called = named_child(tag)
    return [started, called]


def test_an_assigned_id_inside_a_workflow_is_the_childs_id(runtime: da.Runtime) -> None:
    tag = new_id("assigned")
    with da.workflow_id(tag):
        got = parent_with_assigned_ids(tag)
    assert got == [f"{tag}:{tag}-started", f"{tag}:{tag}-called"]
    # Replayed (the same id again), the same children answer.
    with da.workflow_id(tag):
        assert parent_with_assigned_ids(tag) == got
    assert [s.name for s in da.operations.list_steps(tag)].count(START_CHILD_STEP) == 2


QUEUE = da.Queue(f"peer-{uuid.uuid4().hex[:8]}")


@da.durable_workflow
def enqueues_a_child(tag: str) -> str:
    return str(QUEUE.enqueue(named_child, tag).result())


def test_an_enqueue_inside_a_workflow_is_recorded_and_replays_to_the_same_child(
    runtime: da.Runtime, inspector: Inspector
) -> None:
    tag = new_id("enq")
    with da.workflow_id(tag):
        first = enqueues_a_child(tag)
    steps = da.operations.list_steps(tag)
    assert steps[0].name == START_CHILD_STEP
    assert da.operations.fork(tag, len(steps)).result(timeout=30) == first
    children = [w for w in inspector.workflows() if w.name.endswith("named_child")]
    assert [w.workflow_id for w in children if w.workflow_id in first] == [first.split(":")[1]]


def test_result_after_shutdown_raises_a_named_error_at_once(
    dbos_agent_database_url: str, executor_id: str
) -> None:
    rt = da.launch(dbos_agent_database_url, executor_id=executor_id, workers=2)
    handle = da.start(waiting_child, new_id("after-shutdown"))
    rt.shutdown(grace=1)
    with pytest.raises(da.errors.DatabaseClosedError, match="shut down"):
        handle.result(timeout=30)
    with pytest.raises(da.errors.DatabaseClosedError):
        handle.get_info()


@da.step
def numbers(n: int) -> Iterator[int]:
    return (i for i in range(n))


@da.durable_workflow
def returns_a_generator(n: int) -> list[int]:
    return list(numbers(n))


def test_a_step_returning_a_generator_is_refused(runtime: da.Runtime) -> None:
    with pytest.raises(da.errors.SerializationError, match="generator"):
        returns_a_generator(3)


@da.step(timeout=0.2)
async def swallows_its_cancellation(tag: str) -> str:
    STEP_RUNS[tag] += 1
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        await asyncio.sleep(0.1)
        return "late"  # swallowed: the timeout must win anyway
    return "slept"


@da.durable_workflow
async def times_out(tag: str) -> str:
    return await swallows_its_cancellation(tag)


def test_an_async_step_that_swallows_its_timeout_still_times_out(runtime: da.Runtime) -> None:
    tag = new_id("swallow")
    with da.workflow_id(tag), pytest.raises(TimeoutError, match="did not finish within"):
        asyncio.run(times_out(tag))
    (step,) = da.operations.list_steps(tag)
    assert step.status is da.records.StepStatus.ERROR and "TimeoutError" in str(step.error)


def _define(name: str, concurrency: int) -> da.Queue:
    return da.Queue(name, concurrency=concurrency)  # one definition, run again and again


def test_a_queue_name_is_one_queue() -> None:
    name = f"one-{uuid.uuid4().hex[:8]}"
    first = _define(name, 2)
    assert _define(name, 2).concurrency == 2  # the same definition again (a re-import)
    with pytest.raises(da.errors.QueueConflictError, match=name):
        _define(name, 5)  # the same place, other settings
    with pytest.raises(da.errors.QueueConflictError, match="defined twice"):
        da.Queue(name, concurrency=2)  # another definition of the name
    assert _define(name, 2).concurrency == first.concurrency


@pytest.mark.parametrize("priority", [-100, -1, 2**31, True, 1.5])
def test_a_priority_out_of_range_is_refused(runtime: da.Runtime, priority: Any) -> None:
    with pytest.raises((ValueError, TypeError), match="priority"):
        QUEUE.enqueue(named_child, "x", priority=priority)
    with (
        da.Client(runtime.database_url) as client,
        pytest.raises((ValueError, TypeError), match="priority"),
    ):
        client.enqueue(QUEUE.name, "x", priority=priority)


def test_an_empty_topic_is_refused(runtime: da.Runtime) -> None:
    wid = new_id("topic")
    da.start(waiting_child, wid, workflow_id=wid)
    with pytest.raises(da.errors.InvalidIdentifierError, match="empty"):
        da.send(wid, "x", topic="")
    da.send(wid, "done", topic="go")


def test_client_enqueue_honours_the_workflow_timeout_block(runtime: da.Runtime) -> None:
    with da.Client(runtime.database_url) as client, da.workflow_timeout(60):
        handle = client.enqueue(QUEUE.name, "nowhere.unknown_workflow")
    with psycopg.connect(runtime.database_url) as conn:
        row = conn.execute(
            "SELECT deadline_at FROM dbos_agent.workflows WHERE workflow_id = %s",
            (handle.workflow_id,),
        ).fetchone()
    assert row is not None and row[0] is not None


@da.step
def after_the_child(tag: str) -> str:
    STEP_RUNS[tag] += 1
    return "after"


@da.durable_workflow
def calls_then_steps(tag: str, explicit: bool) -> list[str]:
    if explicit:
        child = da.start(named_child, tag, workflow_id=f"{tag}-explicit").result()
    else:
        child = named_child(tag)
    return [child.split(":")[1], after_the_child(tag)]


def _as_old_code_wrote_it(database_url: str, workflow_id: str, *, kept_position: bool) -> None:
    """Remove the start_child record, as a log written before it existed looks: a
    position without a row (a derived child id), or no position at all (an explicit id)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "DELETE FROM dbos_agent.steps WHERE workflow_id = %s AND seq = 0", (workflow_id,)
        )
        if not kept_position:
            conn.execute(
                "UPDATE dbos_agent.steps SET seq = seq - 1 WHERE workflow_id = %s",
                (workflow_id,),
            )


@pytest.mark.parametrize("explicit", [False, True], ids=["derived-id", "explicit-id"])
def test_a_log_written_before_child_starts_were_recorded_still_replays(
    runtime: da.Runtime, explicit: bool
) -> None:
    tag = new_id("old-log")
    with da.workflow_id(tag):
        calls_then_steps(tag, explicit)
    _as_old_code_wrote_it(runtime.database_url, tag, kept_position=not explicit)
    old_log = da.operations.list_steps(tag)
    fork = da.operations.fork(tag, len(old_log) + (0 if explicit else 1))
    child, after = fork.result(timeout=30)
    assert after == "after" and STEP_RUNS[tag] == 1  # the step replayed where it was
    assert child == (f"{tag}-explicit" if explicit else f"{fork.workflow_id}-0")
    assert START_CHILD_STEP not in [s.name for s in da.operations.list_steps(fork.workflow_id)]
