"""Replays that must do what the first run did (a fork, a recovery, a wake-up), and the
calls whose answer a peer (DBOS Transact) defines: each case a peer's own suite found."""

from __future__ import annotations

import uuid

import dbos_agent as da
from dbos_agent.testing import Inspector
from tests.helpers import new_id

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
