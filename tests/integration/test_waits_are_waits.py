"""A wait is a wait, not a doubt: a workflow waiting in ``recv`` or ``get_event`` is shown
as waiting (never "in doubt"), a fork from past its wait waits again, the wait cannot be
"resolved", and a refused fork is a 409 over HTTP, not a 500."""

from __future__ import annotations

import httpx

import dbos_agent as da
from dbos_agent.records import WorkflowStatus
from dbos_agent.testing import Inspector
from tests.helpers import cli, new_id, ok, refused, wait_until


@da.step
def prepare(x: int) -> int:
    return x + 1


@da.durable_workflow(name="waits_receiver")
def receiver(x: int) -> str:
    ready = prepare(x)
    return f"{ready}: {da.recv('go', timeout=3600)}"


@da.durable_workflow(name="waits_watcher")
def watcher(other: str) -> str:
    return str(da.get_event(other, "progress", timeout=3600))


def _suspended(inspector: Inspector, wid: str) -> bool:
    return inspector.status(wid) is WorkflowStatus.SUSPENDED


def test_a_workflow_waiting_for_a_message_is_shown_waiting_and_forked_past_its_wait(
    runtime: da.Runtime, inspector: Inspector, dbos_agent_database_url: str
) -> None:
    wid = new_id("waiting")
    da.start(receiver, 1, workflow_id=wid)
    wait_until(lambda: _suspended(inspector, wid), 30, "the recv to suspend")
    [_, wait] = inspector.steps(wid)
    assert wait.waiting and wait.wait_text().startswith("waiting for a message on topic 'go'")
    shown = ok(cli(dbos_agent_database_url, "workflows", "show", wid))
    assert "waiting for a message on topic 'go'" in shown and "doubt" not in shown
    refused(
        cli(dbos_agent_database_url, "steps", "resolve", wid, "1", "--rerun"),
        1,
        "is a wait in progress, not in doubt",
    )

    fork = da.operations.fork(wid, from_step=2)  # past the wait: the fork waits again
    wait_until(lambda: _suspended(inspector, fork.workflow_id), 30, "the fork to wait")
    assert [s.name for s in inspector.steps(fork.workflow_id)][:1] == ["prepare"]
    da.send(fork.workflow_id, "forked", topic="go")
    assert fork.result(timeout=30) == "2: forked"
    assert inspector.status(wid) is WorkflowStatus.SUSPENDED  # the original waits on
    da.send(wid, "original", topic="go")
    assert da.retrieve(wid).result(timeout=30) == "2: original"


def test_a_fork_past_a_get_event_waits_again(runtime: da.Runtime, inspector: Inspector) -> None:
    publisher = new_id("publisher")
    wid = new_id("watching")
    da.start(watcher, publisher, workflow_id=wid)
    wait_until(lambda: _suspended(inspector, wid), 30, "the get_event to suspend")
    [wait] = inspector.steps(wid)
    assert wait.wait_text().startswith(f"waiting for event 'progress' of {publisher}")
    fork = da.operations.fork(wid, from_step=1)
    wait_until(lambda: _suspended(inspector, fork.workflow_id), 30, "the fork to wait")
    da.operations.cancel(fork.workflow_id)
    da.operations.cancel(wid)


def test_over_http_a_wait_forks_and_a_refused_fork_is_a_conflict(
    api: httpx.Client, inspector: Inspector
) -> None:
    wid = new_id("waiting")
    da.start(receiver, 5, workflow_id=wid)
    wait_until(lambda: _suspended(inspector, wid), 30, "the recv to suspend")
    shown = api.get(f"/api/workflows/{wid}").json()
    wait = shown["steps"][1]
    assert wait["status"] == "PENDING" and wait["waiting"].startswith("waiting for a message")
    forked = api.post(f"/api/workflows/{wid}/fork", json={"from_step": 2})
    assert forked.status_code == 200, forked.text
    past_the_end = api.post(f"/api/workflows/{wid}/fork", json={"from_step": 9})
    assert past_the_end.status_code == 200, past_the_end.text  # from the end (DBOS)
    for done in (wid, forked.json()["workflow_id"], past_the_end.json()["workflow_id"]):
        da.operations.cancel(done)
