"""Replays that must do what the first run did (a fork, a recovery, a wake-up), and the
calls whose answer a peer (DBOS Transact) defines: each case a peer's own suite found."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid

import psycopg
import pytest

import dbos_agent as da
from dbos_agent.testing import Inspector
from tests.helpers import new_id, wait_until

DEDUP_QUEUE = da.Queue(f"dedup-{uuid.uuid4().hex[:8]}")


@da.durable_workflow
def holds_the_dedup_id(tag: str) -> str:
    return str(da.recv("go", timeout=60))


@da.durable_workflow
def deduplicated_child(tag: str) -> str:
    return tag


@da.durable_workflow
def enqueues_under_a_dedup_id(tag: str) -> str:
    try:
        DEDUP_QUEUE.enqueue(deduplicated_child, tag, dedup_id=tag)
    except da.errors.DuplicateEnqueueError as refused:
        return f"refused {refused.dedup_id}"
    return "accepted"


def test_a_refused_deduplicated_enqueue_is_refused_again_on_replay(
    runtime: da.Runtime, inspector: Inspector
) -> None:
    tag = new_id("dedup")
    holder = DEDUP_QUEUE.enqueue(holds_the_dedup_id, tag, dedup_id=tag)
    with da.workflow_id(tag):
        assert enqueues_under_a_dedup_id(tag) == f"refused {tag}"
    da.send(holder.workflow_id, "done", topic="go")
    assert holder.result(timeout=30) == "done"  # the id is free again
    steps = da.operations.list_steps(tag)
    assert da.operations.fork(tag, len(steps)).result(timeout=30) == f"refused {tag}"
    children = [w for w in inspector.workflows() if w.name.endswith("deduplicated_child")]
    assert not [w for w in children if tag in str(w.inputs)]  # no child ran, then or now


@da.durable_workflow
def child_waits_for_go(tag: str, made_up: dict[str, str]) -> str:
    return f"{made_up['id']}:{da.recv('go', timeout=60)}"


@da.durable_workflow
def parent_of_a_made_up_child(tag: str) -> str:
    """Starts a child whose id and input it makes up on every run, and waits on it."""
    made_up = str(uuid.uuid4())
    child = da.start(child_waits_for_go, tag, {"id": made_up}, workflow_id=f"{tag}-{made_up}")
    return child.result()


@da.durable_workflow
def enqueues_a_made_up_child(tag: str) -> str:
    made_up = str(uuid.uuid4())
    return str(DEDUP_QUEUE.enqueue(deduplicated_child, f"{tag}-{made_up}").result())


def _children(inspector: Inspector, tag: str) -> list[str]:
    return [w.workflow_id for w in inspector.workflows() if w.workflow_id.startswith(f"{tag}-")]


def test_a_recorded_child_start_returns_the_recorded_child_whatever_the_replay_computes(
    runtime: da.Runtime, inspector: Inspector
) -> None:
    tag = new_id("made-up")
    parent = da.start(parent_of_a_made_up_child, tag, workflow_id=tag)
    wait_until(lambda: len(_children(inspector, tag)) == 1, 30, "the child started")
    wait_until(
        lambda: inspector.statuses([tag])[tag] is da.WorkflowStatus.SUSPENDED,
        30,
        "the parent suspended on its child's result",
    )
    (child_id,) = _children(inspector, tag)
    da.send(child_id, "done", topic="go")
    # Woken, the parent replays its body: another input, the recorded child.
    assert parent.result(timeout=30) == f"{child_id.removeprefix(tag + '-')}:done"
    steps = da.operations.list_steps(tag)
    assert da.operations.fork(tag, len(steps)).result(timeout=30) == parent.result()
    assert _children(inspector, tag) == [child_id]


def test_a_recorded_enqueue_returns_the_recorded_child_whatever_the_replay_computes(
    runtime: da.Runtime,
) -> None:
    tag = new_id("made-up-enqueue")
    with da.workflow_id(tag):
        first = enqueues_a_made_up_child(tag)
    steps = da.operations.list_steps(tag)
    assert da.operations.fork(tag, len(steps)).result(timeout=30) == first


@da.durable_workflow
async def async_child(made_up: str) -> str:
    return made_up


@da.durable_workflow
async def calls_an_async_child_with_made_up_input(tag: str) -> str:
    return await async_child(str(uuid.uuid4()))


def test_a_recorded_direct_call_of_an_async_child_replays_whatever_the_input(
    runtime: da.Runtime,
) -> None:
    tag = new_id("made-up-async")
    with da.workflow_id(tag):
        first = asyncio.run(calls_an_async_child_with_made_up_input(tag))
    steps = da.operations.list_steps(tag)
    assert da.operations.fork(tag, len(steps)).result(timeout=30) == first


ORDERED = {"zeta": 1, "a": {"yy": 2, "b": [{"z": 1, "c": 2}]}, "mid": None}


@da.durable_workflow
def dumps_its_argument(arg: dict[str, object]) -> str:
    return json.dumps(arg)


@pytest.mark.parametrize("how", ["client", "queue", "start"])
def test_the_order_of_an_arguments_keys_is_the_callers(runtime: da.Runtime, how: str) -> None:
    if how == "client":
        with da.Client(runtime.database_url) as client:
            handle = client.enqueue(DEDUP_QUEUE.name, dumps_its_argument.__qualname__, ORDERED)
            assert handle.result(timeout=30) == json.dumps(ORDERED)
        return
    if how == "queue":
        assert DEDUP_QUEUE.enqueue(dumps_its_argument, ORDERED).result(timeout=30) == json.dumps(
            ORDERED
        )
        return
    assert da.start(dumps_its_argument, ORDERED, delay=0.01).result(timeout=30) == json.dumps(
        ORDERED
    )


@pytest.mark.parametrize("blank", [" ", "\t\n", "\u3000"])
def test_a_workflow_id_of_only_whitespace_is_refused(runtime: da.Runtime, blank: str) -> None:
    with pytest.raises(da.errors.InvalidIdentifierError, match="whitespace"):
        da.start(deduplicated_child, "x", workflow_id=blank)
    with pytest.raises(da.errors.InvalidIdentifierError, match="whitespace"), da.workflow_id(blank):
        deduplicated_child("x")
    with pytest.raises(da.errors.InvalidIdentifierError, match="whitespace"):
        DEDUP_QUEUE.enqueue(deduplicated_child, "x", workflow_id=blank)
    with (
        da.Client(runtime.database_url) as client,
        pytest.raises(da.errors.InvalidIdentifierError, match="whitespace"),
    ):
        client.enqueue(DEDUP_QUEUE.name, "deduplicated_child", workflow_id=blank)


@da.durable_workflow
def publishes_later(tag: str) -> str:
    da.set_event("ready", tag)
    da.write_stream("out", tag)
    da.close_stream("out")
    return tag


def _start_soon(tag: str) -> threading.Thread:
    """Start ``publishes_later`` a moment from now: the reader asks before it exists (a loaded
    machine may start the reader later, which only makes the case easier)."""

    def start() -> None:
        time.sleep(0.5)
        da.start(publishes_later, tag, workflow_id=tag)

    thread = threading.Thread(target=start)
    thread.start()
    return thread


def test_client_get_event_waits_for_a_workflow_that_does_not_exist_yet(
    runtime: da.Runtime,
) -> None:
    tag = new_id("event-later")
    with da.Client(runtime.database_url) as client:
        assert client.get_event(new_id("never"), "ready", "none", timeout=0.2) == "none"
        thread = _start_soon(tag)
        assert client.get_event(tag, "ready", timeout=30) == tag
        thread.join()


def test_read_stream_waits_for_a_workflow_that_does_not_exist_yet(runtime: da.Runtime) -> None:
    tag = new_id("stream-later")
    with pytest.raises(da.errors.WorkflowNotFoundError):
        list(da.read_stream(new_id("never"), "out", timeout=0.2))
    thread = _start_soon(tag)
    assert [item.value for item in da.read_stream(tag, "out", timeout=30)] == [tag]
    with da.Client(runtime.database_url) as client:
        other = new_id("stream-later")
        thread.join()
        thread = _start_soon(other)
        assert [item.value for item in client.read_stream(other, "out", timeout=30)] == [other]
    thread.join()


@da.durable_workflow
async def patches_concurrently(tag: str) -> list[bool]:
    return list(await asyncio.gather(da.aio.patched("first"), da.aio.patched("second")))


@da.durable_workflow
async def patches_in_turn(tag: str) -> list[bool]:
    return [await da.aio.patched("first"), await da.aio.patched("second")]


def test_concurrent_patched_async_calls_are_refused(runtime: da.Runtime) -> None:
    with pytest.raises(da.errors.PatchError, match="in progress"):
        asyncio.run(patches_concurrently(new_id("gather")))
    assert asyncio.run(patches_in_turn(new_id("in-turn"))) == [True, True]


@da.durable_workflow
def two_children(tag: str) -> list[str]:
    return [deduplicated_child(f"{tag}-a"), deduplicated_child(f"{tag}-b")]


def test_a_fork_past_the_end_of_the_log_runs_from_its_end(runtime: da.Runtime) -> None:
    tag = new_id("fork-past")
    with da.workflow_id(tag):
        first = two_children(tag)
    end = len(da.operations.list_steps(tag))
    fork = da.operations.fork(tag, end + 7)
    assert fork.from_step == end and fork.result(timeout=30) == first
    with da.Client(runtime.database_url) as client:
        assert client.fork(tag, end + 1).result(30) == first


def test_resume_starts_an_enqueued_or_delayed_workflow_now(runtime: da.Runtime) -> None:
    queued = DEDUP_QUEUE.enqueue(deduplicated_child, new_id("queued"), delay=3600)
    delayed = da.start(deduplicated_child, new_id("delayed"), delay=3600)
    for handle in (queued, delayed):
        assert handle.get_info().status in (da.WorkflowStatus.ENQUEUED, da.WorkflowStatus.SUSPENDED)
        resumed = da.operations.resume(handle.workflow_id)
        assert resumed.result(timeout=30) == handle.get_info().inputs["tag"]
    with da.Client(runtime.database_url) as client:
        later = client.enqueue(DEDUP_QUEUE.name, "deduplicated_child", "by-client", delay=3600)
        client.resume(later.workflow_id)
        assert later.result(30) == "by-client"


def test_resume_of_a_finished_workflow_returns_its_handle(runtime: da.Runtime) -> None:
    tag = new_id("finished")
    with da.workflow_id(tag):
        first = two_children(tag)
    assert da.operations.resume(tag).result(timeout=30) == first
    with da.Client(runtime.database_url) as client:
        assert client.resume(tag).result(30) == first
    assert len(da.operations.list_steps(tag)) == 2  # nothing ran again


@da.durable_workflow
def starts_a_child_under_a_deadline(tag: str) -> str:
    return da.start(deduplicated_child, tag).workflow_id


def _deadline(url: str, workflow_id: str) -> object:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT deadline_at FROM dbos_agent.workflows WHERE workflow_id = %s", (workflow_id,)
        ).fetchone()
    assert row is not None
    return row[0]


def test_a_child_inherits_its_parents_deadline(runtime: da.Runtime) -> None:
    tag = new_id("deadline")
    with da.workflow_timeout(3600):
        parent = da.start(starts_a_child_under_a_deadline, tag, workflow_id=tag)
    child_id = parent.result(timeout=30)
    deadline = _deadline(runtime.database_url, tag)
    assert deadline is not None and _deadline(runtime.database_url, child_id) == deadline
