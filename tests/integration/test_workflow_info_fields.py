"""What a workflow's record says of where it comes from and how its queue treated it:
``priority``, ``deduplication_id``, ``dequeued_at``, ``parent_workflow_id`` and
``forked_from`` (with ``forked_from_step``), the same in ``WorkflowInfo``, ``workflows show``
(text and ``--json``) and the API's document."""

from __future__ import annotations

import json

import httpx

import dbos_agent as da
from tests.helpers import cli, new_id, ok
from tests.support.web import TOKEN, Server


@da.step
def add_one(x: int) -> int:
    return x + 1


@da.durable_workflow
def child(x: int) -> int:
    return add_one(x)


@da.durable_workflow
def parent(x: int, child_id: str) -> int:
    return da.start(child, x, workflow_id=child_id).result()


def test_queue_fields_parent_and_fork_origin_are_on_the_record(
    queue_runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    queue = da.Queue(new_id("q"))
    queued = queue.enqueue(child, 1, priority=3, dedup_id="order-7")
    assert queued.result(30) == 2
    info = queued.get_info()
    assert (info.priority, info.deduplication_id) == (3, "order-7")
    assert info.dequeued_at is not None  # (a transaction-start time: it may precede created_at)
    assert info.parent_workflow_id is None and info.forked_from is None

    parent_id, child_id = new_id("parent"), new_id("child")
    assert da.start(parent, 5, child_id, workflow_id=parent_id).result(30) == 6
    started = da.retrieve(child_id).get_info()
    assert started.parent_workflow_id == parent_id
    assert (started.priority, started.deduplication_id, started.dequeued_at) == (0, None, None)

    fork = da.operations.fork(child_id, 1)
    fork.result(30)
    forked = fork.get_info()
    assert (forked.forked_from, forked.forked_from_step) == (child_id, 1)

    with da.Client(dbos_agent_database_url) as client:
        assert client.get_workflow(child_id).parent_workflow_id == parent_id
        listed = {i.workflow_id: i for i in client.list_workflows(queue=queue.name)}
        assert listed[queued.workflow_id].deduplication_id == "order-7"

    text = ok(cli(dbos_agent_database_url, "workflows", "show", queued.workflow_id))
    assert "Priority" in text and "order-7" in text and "Dequeued" in text
    text = ok(cli(dbos_agent_database_url, "workflows", "show", forked.workflow_id))
    assert f"{child_id} at step 1" in text and "Parent" not in text
    assert "Parent" in ok(cli(dbos_agent_database_url, "workflows", "show", child_id))
    shown = json.loads(
        ok(cli(dbos_agent_database_url, "workflows", "show", queued.workflow_id, "--json"))
    )
    assert shown["priority"] == 3 and shown["deduplication_id"] == "order-7"
    assert shown["dequeued_at"] is not None and shown["parent_workflow_id"] is None

    with (
        Server(dbos_agent_database_url, TOKEN) as server,
        httpx.Client(base_url=server.base, headers={"Authorization": f"Bearer {TOKEN}"}) as api,
    ):
        document = api.get(f"/api/workflows/{forked.workflow_id}").json()
        assert (document["forked_from"], document["forked_from_step"]) == (child_id, 1)
        document = api.get(f"/api/workflows/{child_id}").json()
        assert document["parent_workflow_id"] == parent_id
        listed_docs = api.get("/api/workflows", params={"queue": queue.name}).json()
        assert [d["deduplication_id"] for d in listed_docs] == ["order-7"]
