"""Cancel, resume and delete many workflows (``Client.cancel_workflows``,
``resume_workflows``, ``delete_workflows``; ``dbos-agent workflows cancel|resume|delete``):
by ids or by a filter, in batches of one statement each, each workflow treated as the
one-workflow action treats it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

import dbos_agent as da
from dbos_agent.records import WorkflowFilter
from dbos_agent.testing import Inspector
from tests.helpers import cli, new_id, ok, refused, wait_until
from tests.support.web import TOKEN, Server


@da.durable_workflow(name="bulk_waiter")
def waiter(tag: str) -> str:
    return f"{tag}: {da.recv('go', timeout=300)}"


@da.durable_workflow(name="bulk_parent")
def parent(tag: str, child_id: str) -> str:
    return da.start(waiter, tag, workflow_id=child_id).result()


@da.durable_workflow(name="bulk_done")
def done(tag: str) -> str:
    return tag


@pytest.fixture
def client(runtime: da.Runtime, dbos_agent_database_url: str) -> Iterator[da.Client]:
    with da.Client(dbos_agent_database_url) as c:
        yield c


def test_cancel_by_ids_treats_each_as_a_cancel_does(
    client: da.Client, inspector: Inspector
) -> None:
    tag = new_id("tag")
    waiting = [da.start(waiter, tag) for _ in range(5)]
    child_id = new_id("child")
    started = da.start(parent, tag, child_id)
    finished = da.start(done, tag)
    finished.result(30)
    wait_until(lambda: inspector.workflow(child_id) is not None, message="the child started")
    ids = [h.workflow_id for h in waiting] + [started.workflow_id, finished.workflow_id]
    missing = new_id("missing")

    counted = client.cancel_workflows([*ids, missing], dry_run=True, batch_size=3)
    assert (counted.matched, counted.changed, counted.statements) == (7, 6, 3)
    assert client.get_workflow(ids[0]).status is not da.WorkflowStatus.CANCELLED

    report = client.cancel_workflows([*ids, missing], batch_size=3)
    assert (report.requested, report.matched, report.changed) == (8, 7, 6)
    assert (report.skipped, report.children, report.statements) == (1, 1, 3)
    for handle in [*waiting, started]:
        with pytest.raises(da.WorkflowCancelledError):
            handle.result(30)
    child = client.get_workflow(child_id)
    assert child.status is da.WorkflowStatus.CANCELLED
    assert child.error is not None and started.workflow_id in child.error["message"]
    assert client.get_workflow(finished.workflow_id).status is da.WorkflowStatus.SUCCESS
    again = client.cancel_workflows(ids)
    assert (again.matched, again.changed) == (7, 0), "cancelled again: nothing changes"


def test_resume_and_delete_by_filter(client: da.Client, inspector: Inspector) -> None:
    since = datetime.now(UTC) - timedelta(seconds=1)
    tag = new_id("tag")
    handles = [da.start(waiter, tag) for _ in range(4)]
    mine = WorkflowFilter(name="bulk_waiter", created_after=since)
    assert client.cancel_workflows(where=mine).changed >= 4
    cancelled = WorkflowFilter(
        name="bulk_waiter", status=da.WorkflowStatus.CANCELLED, created_after=since
    )
    report = client.resume_workflows(where=cancelled)
    assert report.requested is None and report.changed >= 4 and report.statements >= 2
    for handle in handles:
        client.send(handle.workflow_id, "now", "go")
    assert {client.retrieve(h.workflow_id).result(30) for h in handles} == {f"{tag}: now"}

    unfinished = da.start(waiter, tag)
    ids = [h.workflow_id for h in handles] + [unfinished.workflow_id]
    report = client.delete_workflows(ids, where=WorkflowFilter(name="bulk_waiter"))
    assert (report.matched, report.changed, report.skipped) == (5, 4, 1)
    assert all(inspector.rows_of(h.workflow_id).workflows == 0 for h in handles)
    assert all(inspector.rows_of(h.workflow_id).steps == 0 for h in handles)
    assert inspector.messages(handles[0].workflow_id) == []
    assert client.get_workflow(unfinished.workflow_id).status is not da.WorkflowStatus.CANCELLED
    client.cancel(unfinished.workflow_id)


def test_a_filterless_bulk_action_must_say_all(client: da.Client) -> None:
    with pytest.raises(da.errors.InvalidOptionError, match="all_workflows=True"):
        client.delete_workflows()
    counted = client.delete_workflows(all_workflows=True, dry_run=True)
    assert counted.dry_run and counted.matched >= counted.changed


def test_a_batch_with_two_holders_of_one_dedup_id_resumes_one(
    queue_runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    queue = da.Queue(new_id("q"))
    first = queue.enqueue(waiter, "a", dedup_id="d")
    da.operations.cancel(first.workflow_id)
    second = queue.enqueue(waiter, "b", dedup_id="d")
    da.operations.cancel(second.workflow_id)
    with da.Client(dbos_agent_database_url) as client:
        report = client.resume_workflows([first.workflow_id, second.workflow_id])
        assert (report.matched, report.changed) == (2, 1)
        statuses = {client.get_workflow(h.workflow_id).status for h in (first, second)}
        assert da.WorkflowStatus.CANCELLED in statuses and len(statuses) == 2
        client.cancel_workflows([first.workflow_id, second.workflow_id])


def test_the_cli_takes_many_ids_or_filters(
    runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    url = dbos_agent_database_url
    tag = new_id("tag")
    handles = [da.start(waiter, tag) for _ in range(3)]
    ids = [h.workflow_id for h in handles]
    out = json.loads(ok(cli(url, "workflows", "cancel", *ids, "--dry-run", "--json")))
    assert (out["matched"], out["changed"], out["dry_run"]) == (3, 3, True)
    text = ok(cli(url, "workflows", "cancel", *ids, "--batch-size", "2"))
    assert "cancelled 3 of 3 matching workflow(s)" in text and "(2 statement(s))" in text

    refused(cli(url, "workflows", "delete", "--json"), 1, "--all", as_json=True)
    refused(cli(url, "workflows", "delete"), 1, "give IDs, a filter")

    out = json.loads(
        ok(
            cli(
                url,
                "workflows",
                "delete",
                "--name",
                "bulk_waiter",
                "--status",
                "CANCELLED",
                "--dry-run",
                "--json",
            )
        )
    )
    assert out["changed"] >= 3 and out["requested"] is None
    out = json.loads(
        ok(cli(url, "workflows", "delete", *ids, "--older-than", "1d", "--dry-run", "--json"))
    )
    assert (out["requested"], out["matched"]) == (3, 0), "none is older than a day"
    text = ok(cli(url, "workflows", "delete", *ids[1:]))
    assert "deleted 2 of 2" in text
    assert f"deleted {ids[0]} (it was CANCELLED)" in ok(cli(url, "workflows", "delete", ids[0]))
    unfinished = da.start(waiter, tag)
    refused(cli(url, "workflows", "delete", unfinished.workflow_id), 1, "cancel it first")
    refused(cli(url, "workflows", "delete", str(uuid.uuid4())), 1, "no workflow with id")
    ok(cli(url, "workflows", "cancel", unfinished.workflow_id))
    refused(
        cli(url, "workflows", "resume", ids[0], unfinished.workflow_id, "--executor", "e"),
        1,
        "--executor goes with one ID",
    )


def test_the_api_takes_ids_or_filters_under_its_security_rules(
    api: httpx.Client, server: Server
) -> None:
    tag = new_id("tag")
    handles = [da.start(waiter, tag) for _ in range(3)]
    ids = [h.workflow_id for h in handles]
    body = {"workflow_ids": ids, "dry_run": True}
    foreign = httpx.post(
        f"{server.base}/api/workflows/cancel",
        json=body,
        headers={"Authorization": f"Bearer {TOKEN}", "Origin": "http://evil.example"},
    )
    assert foreign.status_code == 403, foreign.text
    assert httpx.post(f"{server.base}/api/workflows/cancel", json=body).status_code == 401
    plain = api.post("/api/workflows/cancel", content=b"{}", headers={"Content-Type": "text/plain"})
    assert plain.status_code == 415

    counted = api.post("/api/workflows/cancel", json=body).json()
    assert (counted["matched"], counted["changed"], counted["dry_run"]) == (3, 3, True)
    sent = api.post(
        "/api/workflows/send",
        json={"messages": [{"workflow_id": i, "message": "go!", "topic": "go"} for i in ids[:2]]},
    )
    assert sent.json() == {"messages": 2, "sent": 2}
    assert {h.result(30) for h in handles[:2]} == {f"{tag}: go!"}
    missing = api.post(
        "/api/workflows/send", json={"messages": [{"workflow_id": new_id(), "message": 1}]}
    )
    assert missing.status_code == 404

    done = api.post("/api/workflows/cancel", json={"workflow_ids": ids}).json()
    assert (done["matched"], done["changed"], done["skipped"]) == (3, 1, 2)
    refused_all = api.post("/api/workflows/delete", json={})
    assert refused_all.status_code == 400 and "all" in refused_all.json()["error"]
    bad_age = api.post("/api/workflows/delete", json={"name": "x", "older_than": "soon"})
    assert bad_age.status_code == 400
    deleted = api.post(
        "/api/workflows/delete", json={"workflow_ids": ids, "name": "bulk_waiter"}
    ).json()
    assert (deleted["requested"], deleted["changed"]) == (3, 3)
    assert api.get(f"/api/workflows/{ids[0]}").status_code == 404
